-- The deploy lifecycle: what a deployment was asked for (its regions and
-- timeout, so its workflow can be started again from the row alone), every
-- deployment's status history, and each environment's live deployment.

-- +goose Up
ALTER TABLE deployments
  ADD COLUMN requested_regions JSON NULL AFTER rolled_back_from,
  ADD COLUMN timeout_seconds   INT  NOT NULL DEFAULT 0 AFTER requested_regions,
  ADD KEY deployments_status (status, updated_at);

-- One row per status change, written in the transaction that made it (a
-- compare-and-set), so a retried step never records a transition twice.
CREATE TABLE deployment_events (
  deployment_id VARCHAR(64) NOT NULL,
  seq           INT         NOT NULL,
  status        ENUM('pending','deploying','network','ready','failed','stopped') NOT NULL,
  message       TEXT        NULL,
  created_at    BIGINT      NOT NULL,
  PRIMARY KEY (deployment_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE environments (
  id                 VARCHAR(64) NOT NULL,
  live_deployment_id VARCHAR(64) NULL,
  updated_at         BIGINT      NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE environments;
DROP TABLE deployment_events;
ALTER TABLE deployments
  DROP KEY deployments_status,
  DROP COLUMN timeout_seconds,
  DROP COLUMN requested_regions;
