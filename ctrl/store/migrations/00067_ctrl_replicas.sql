-- krane:phase expand
--
-- The ctrl replicas sharing this database, each as it last said: when it
-- last read the revoked tokens, by the database's clock. `ctrl admin token
-- revoke` waits until every replica that reads the database has read past
-- the revocation, so a revoked token is refused everywhere when it returns
-- (ctrl/auth). Rows of replicas silent for an hour are removed.

-- +goose Up
CREATE TABLE ctrl_replicas (
  id                   CHAR(32)    NOT NULL,
  version              VARCHAR(64) NOT NULL,
  started_at           BIGINT      NOT NULL,
  seen_at              BIGINT      NOT NULL,
  revocations_read_at  BIGINT      NOT NULL,
  PRIMARY KEY (id),
  KEY ctrl_replicas_seen (seen_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE ctrl_replicas;
