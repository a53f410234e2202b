-- Sentinel convergence: which SentinelService.Deploy owns a sentinel's
-- deploy_status, and why its last deploy failed. Every later transition of
-- deploy_status is a compare-and-set on deploy_request, so a late step of an
-- earlier deploy (a timeout, a retried Restate step) never overwrites the
-- outcome of a newer one.

-- +goose Up
ALTER TABLE sentinels
  ADD COLUMN deploy_request VARCHAR(255) NOT NULL DEFAULT '' AFTER deploy_status,
  ADD COLUMN deploy_message TEXT NULL AFTER deploy_request,
  ADD KEY sentinels_deploy_status (deploy_status, updated_at);

-- +goose Down
ALTER TABLE sentinels
  DROP KEY sentinels_deploy_status,
  DROP COLUMN deploy_message,
  DROP COLUMN deploy_request;
