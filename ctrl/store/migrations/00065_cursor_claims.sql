-- krane:phase expand
--
-- What clusters claimed of the database's past: a stream whose cursor is
-- ahead of the head says the database went back in time, but one cluster's
-- word must not move the whole fleet (one token, or one host restored from
-- an old backup, could). Each such stream is refused and its claim kept
-- here, one row per cluster; the database takes a new generation (every
-- host bootstraps again) only on the operator's word (`ctrl admin db
-- restored`) or when claims of several clusters agree (store.CheckCursor).

-- +goose Up
CREATE TABLE cursor_claims (
  cluster_id  VARCHAR(64)     NOT NULL,
  region      VARCHAR(64)     NOT NULL,
  cursor_at   BIGINT UNSIGNED NOT NULL,
  head        BIGINT UNSIGNED NOT NULL,
  generation  CHAR(32)        NOT NULL,
  claimed_at  BIGINT          NOT NULL,
  PRIMARY KEY (cluster_id),
  KEY cursor_claims_recent (generation, claimed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE cursor_claims;
