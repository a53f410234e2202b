-- krane:phase expand
--
-- What a sentinel routes (krane.cluster.v1.SentinelRoutes as protojson):
-- its environment's hosts and live deployment, kept on each sentinel row
-- and written with it, so a promote, a rollback or new hosts reach the
-- cluster as a new version of the environment's sentinels. NULL: nothing
-- to route yet (and rows of the previous release). environment_hosts
-- holds each environment's hosts, one environment per host.

-- +goose Up
ALTER TABLE sentinels ADD COLUMN routes JSON NULL, ALGORITHM=INSTANT;

CREATE TABLE environment_hosts (
  host           VARCHAR(253) NOT NULL,
  environment_id VARCHAR(64)  NOT NULL,
  created_at     BIGINT       NOT NULL,
  PRIMARY KEY (host),
  KEY environment_hosts_environment (environment_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE environment_hosts;
ALTER TABLE sentinels DROP COLUMN routes;
