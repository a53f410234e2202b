-- Removals of clusters (`ctrl cluster remove`, FleetService.RemoveCluster):
-- who removed which cluster, when, and what went with it. A removed
-- cluster's own rows (clusters, object_reports, instances, apply_errors)
-- are deleted; this row is what remains of it, with its revoked tokens.

-- +goose Up
CREATE TABLE cluster_audit (
  id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  cluster_id VARCHAR(64)     NOT NULL,
  region     VARCHAR(64)     NOT NULL,
  action     VARCHAR(32)     NOT NULL,
  actor      VARCHAR(255)    NOT NULL,
  detail     VARCHAR(1024)   NOT NULL DEFAULT '',
  created_at BIGINT          NOT NULL,
  PRIMARY KEY (id),
  KEY cluster_audit_cluster (cluster_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE cluster_audit;
