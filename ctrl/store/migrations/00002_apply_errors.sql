-- Changes a cluster could not apply: parked by the agent (a permanent error,
-- or retries exhausted) and reported upstream with the reason. A row is
-- removed when the cluster reports the object applied again. Workflows read
-- it to fail fast with the cluster's own explanation.

-- +goose Up
CREATE TABLE apply_errors (
  kind        VARCHAR(128) NOT NULL,
  region      VARCHAR(64)  NOT NULL,
  id          VARCHAR(253) NOT NULL,
  cluster_id  VARCHAR(64)  NOT NULL,
  version     BIGINT UNSIGNED NOT NULL,
  message     TEXT         NOT NULL,
  field       VARCHAR(255) NOT NULL DEFAULT '',
  permanent   BOOLEAN      NOT NULL,
  updated_at  BIGINT       NOT NULL,
  PRIMARY KEY (kind, region, id, cluster_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE apply_errors;
