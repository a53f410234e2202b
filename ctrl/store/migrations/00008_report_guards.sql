-- Status reports are ordered per (object, cluster): a report is judged
-- against the last one accepted from the same cluster only, so with two
-- clusters in a region neither one's reports are dropped as older than the
-- other's (their clocks differ). received_at_ns is ctrl's clock when the
-- guarded report was accepted: an older observation at the same version
-- is taken for a delayed copy only within the reorder window after it (a
-- new leader whose clock is behind is heard after that). The objects'
-- report_observed_* columns keep the last accepted report of any cluster.

-- +goose Up
CREATE TABLE report_guards (
  kind             VARCHAR(128)    NOT NULL,
  region           VARCHAR(64)     NOT NULL,
  id               VARCHAR(253)    NOT NULL,
  cluster_id       VARCHAR(64)     NOT NULL,
  observed_version BIGINT UNSIGNED NOT NULL,
  observed_at_ns   BIGINT          NOT NULL,
  received_at_ns   BIGINT          NOT NULL,
  PRIMARY KEY (kind, region, id, cluster_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE report_guards;
