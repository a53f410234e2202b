-- What a step that may run twice needs to answer the same the second time.
-- sentinels.ensured_by: the deployment whose deploy created the sentinel or
-- set it running again, so the deploy's step, run again, still names it.
-- sentinels.deploy_changed: whether the SentinelService.Deploy that owns
-- the row (deploy_request) changed the configuration, so its write step,
-- run again, still reports the change.

-- +goose Up
ALTER TABLE sentinels
  ADD COLUMN ensured_by     VARCHAR(64) NULL AFTER desired_state,
  ADD COLUMN deploy_changed BOOLEAN     NOT NULL DEFAULT FALSE AFTER deploy_message;

-- +goose Down
ALTER TABLE sentinels
  DROP COLUMN deploy_changed,
  DROP COLUMN ensured_by;
