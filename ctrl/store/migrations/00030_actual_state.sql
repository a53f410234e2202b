-- Actual state apart from desired state: what each cluster last reported
-- on each object, one row per (object, cluster), instead of one set of
-- status columns per object that every cluster of the region overwrote.
--
-- object_reports is both the status and the order guard of a cluster's
-- reports (it replaces report_guards): observed_version and
-- observed_at_ns order a cluster's reports on the object, received_at_ns
-- is ctrl's clock when the row was written (the reorder window). status is
-- the status as JSON (built-in kinds: the protojson form of their status
-- message with proto field names, a deployment's without its instances,
-- which stay in instances); NULL when the cluster only reported a version.
-- status_sum is a 64-bit hash of everything the report carried (status,
-- instances, deleted): a report equal to the stored one writes nothing.
-- deleted: the cluster reported the object gone.
--
-- The moved data: every report guard becomes a row at its version; the
-- object's status columns go to the cluster whose guard matches the
-- object's last accepted report (same version and observation time), the
-- only cluster that can have sent them. Objects reported before guards
-- existed (no guard at all) go to their region's cluster when it has
-- exactly one; otherwise the cluster is unknown and the row is dropped
-- (the next report of each cluster writes it again).
--
-- Down restores the guards and empty status columns: statuses are reported
-- again by the clusters within a resync.

-- +goose Up
CREATE TABLE object_reports (
  kind             VARCHAR(128)    NOT NULL,
  region           VARCHAR(64)     NOT NULL,
  id               VARCHAR(253)    NOT NULL,
  cluster_id       VARCHAR(64)     NOT NULL,
  observed_version BIGINT UNSIGNED NOT NULL,
  observed_at_ns   BIGINT          NOT NULL,
  received_at_ns   BIGINT          NOT NULL,
  deleted          BOOLEAN         NOT NULL DEFAULT FALSE,
  status           JSON            NULL,
  status_sum       BIGINT UNSIGNED NOT NULL DEFAULT 0,
  PRIMARY KEY (kind, region, id, cluster_id),
  KEY object_reports_cluster (cluster_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns FROM report_guards;

-- Objects reported before report guards existed: their region's only cluster.
INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT 'deployment', t.region, t.deployment_id, c.id, t.report_observed_version, t.report_observed_at_ns, t.report_observed_at_ns
FROM deployment_topology t JOIN clusters c ON c.region = t.region
WHERE t.report_observed_version > 0
  AND (SELECT COUNT(*) FROM clusters c2 WHERE c2.region = t.region) = 1
  AND NOT EXISTS (SELECT 1 FROM report_guards g WHERE g.kind = 'deployment' AND g.region = t.region AND g.id = t.deployment_id);
INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT 'sentinel', s.region, s.id, c.id, s.report_observed_version, s.report_observed_at_ns, s.report_observed_at_ns
FROM sentinels s JOIN clusters c ON c.region = s.region
WHERE s.report_observed_version > 0
  AND (SELECT COUNT(*) FROM clusters c2 WHERE c2.region = s.region) = 1
  AND NOT EXISTS (SELECT 1 FROM report_guards g WHERE g.kind = 'sentinel' AND g.region = s.region AND g.id = s.id);
INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT 'ciliumnetworkpolicy', p.region, p.id, c.id, p.report_observed_version, p.report_observed_at_ns, p.report_observed_at_ns
FROM cilium_network_policies p JOIN clusters c ON c.region = p.region
WHERE p.report_observed_version > 0
  AND (SELECT COUNT(*) FROM clusters c2 WHERE c2.region = p.region) = 1
  AND NOT EXISTS (SELECT 1 FROM report_guards g WHERE g.kind = 'ciliumnetworkpolicy' AND g.region = p.region AND g.id = p.id);
INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT r.kind, r.region, r.id, c.id, r.report_observed_version, r.report_observed_at_ns, r.report_observed_at_ns
FROM resources r JOIN clusters c ON c.region = r.region
WHERE r.report_observed_version > 0
  AND (SELECT COUNT(*) FROM clusters c2 WHERE c2.region = r.region) = 1
  AND NOT EXISTS (SELECT 1 FROM report_guards g WHERE g.kind = r.kind AND g.region = r.region AND g.id = r.id);

-- Each object's status to the cluster that sent it.
UPDATE object_reports o JOIN deployment_topology t
  ON o.kind = 'deployment' AND t.deployment_id = o.id AND t.region = o.region
  AND t.report_observed_version = o.observed_version AND t.report_observed_at_ns = o.observed_at_ns
SET o.deleted = t.reported_deleted,
  o.status = CONCAT('{"desired_replicas":', t.reported_desired_replicas, ',"ready_replicas":', t.reported_ready_replicas,
    ',"available_replicas":', t.reported_available_replicas, '}');
UPDATE object_reports o JOIN sentinels s
  ON o.kind = 'sentinel' AND s.id = o.id AND s.region = o.region
  AND s.report_observed_version = o.observed_version AND s.report_observed_at_ns = o.observed_at_ns
SET o.deleted = s.reported_deleted,
  o.status = CONCAT('{"running_image":', JSON_QUOTE(s.running_image), ',"available_replicas":', s.available_replicas,
    ',"updated_replicas":', s.updated_replicas, ',"ready_replicas":', s.ready_replicas,
    ',"observed_generation":', s.observed_generation, ',"health":', JSON_QUOTE(CONCAT('HEALTH_', UPPER(s.health))),
    ',"reason":', JSON_QUOTE(s.health_reason), '}');
UPDATE object_reports o JOIN cilium_network_policies p
  ON o.kind = 'ciliumnetworkpolicy' AND p.id = o.id AND p.region = o.region
  AND p.report_observed_version = o.observed_version AND p.report_observed_at_ns = o.observed_at_ns
SET o.deleted = p.reported_deleted,
  o.status = CONCAT('{"applied":', IF(p.status_applied, 'true', 'false'), ',"message":', JSON_QUOTE(COALESCE(p.status_message, '')), '}');
UPDATE object_reports o JOIN resources r
  ON o.kind = r.kind AND r.id = o.id AND r.region = o.region
  AND r.report_observed_version = o.observed_version AND r.report_observed_at_ns = o.observed_at_ns
SET o.status = r.status;

DROP TABLE report_guards;
ALTER TABLE deployment_topology
  DROP COLUMN report_observed_version, DROP COLUMN report_observed_at_ns, DROP COLUMN reported_desired_replicas,
  DROP COLUMN reported_ready_replicas, DROP COLUMN reported_available_replicas, DROP COLUMN reported_deleted;
ALTER TABLE sentinels
  DROP COLUMN running_image, DROP COLUMN available_replicas, DROP COLUMN updated_replicas, DROP COLUMN ready_replicas,
  DROP COLUMN observed_generation, DROP COLUMN health, DROP COLUMN health_reason, DROP COLUMN reported_deleted,
  DROP COLUMN report_observed_version, DROP COLUMN report_observed_at_ns;
ALTER TABLE cilium_network_policies
  DROP COLUMN status_applied, DROP COLUMN status_message, DROP COLUMN reported_deleted,
  DROP COLUMN report_observed_version, DROP COLUMN report_observed_at_ns;
ALTER TABLE resources
  DROP COLUMN status, DROP COLUMN report_observed_version, DROP COLUMN report_observed_at_ns;

-- A removed cluster's apply errors go with it: find them by cluster.
ALTER TABLE apply_errors ADD KEY apply_errors_cluster (cluster_id);

-- +goose Down
ALTER TABLE apply_errors DROP KEY apply_errors_cluster;
ALTER TABLE resources
  ADD COLUMN status JSON NULL AFTER version,
  ADD COLUMN report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER status,
  ADD COLUMN report_observed_at_ns BIGINT NOT NULL DEFAULT 0 AFTER report_observed_version;
ALTER TABLE cilium_network_policies
  ADD COLUMN status_applied BOOLEAN NOT NULL DEFAULT FALSE AFTER version,
  ADD COLUMN status_message TEXT NULL AFTER status_applied,
  ADD COLUMN reported_deleted BOOLEAN NOT NULL DEFAULT FALSE AFTER status_message,
  ADD COLUMN report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER reported_deleted,
  ADD COLUMN report_observed_at_ns BIGINT NOT NULL DEFAULT 0 AFTER report_observed_version;
ALTER TABLE sentinels
  ADD COLUMN running_image VARCHAR(512) NOT NULL DEFAULT '' AFTER desired_state,
  ADD COLUMN available_replicas INT NOT NULL DEFAULT 0 AFTER running_image,
  ADD COLUMN updated_replicas INT NOT NULL DEFAULT 0 AFTER available_replicas,
  ADD COLUMN ready_replicas INT NOT NULL DEFAULT 0 AFTER updated_replicas,
  ADD COLUMN observed_generation BIGINT NOT NULL DEFAULT 0 AFTER ready_replicas,
  ADD COLUMN health ENUM('unknown','healthy','unhealthy','paused') NOT NULL DEFAULT 'unknown' AFTER observed_generation,
  ADD COLUMN health_reason VARCHAR(1024) NOT NULL DEFAULT '' AFTER health,
  ADD COLUMN reported_deleted BOOLEAN NOT NULL DEFAULT FALSE AFTER health_reason,
  ADD COLUMN report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER version,
  ADD COLUMN report_observed_at_ns BIGINT NOT NULL DEFAULT 0 AFTER report_observed_version;
ALTER TABLE deployment_topology
  ADD COLUMN report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER version,
  ADD COLUMN report_observed_at_ns BIGINT NOT NULL DEFAULT 0 AFTER report_observed_version,
  ADD COLUMN reported_desired_replicas INT NOT NULL DEFAULT 0 AFTER report_observed_at_ns,
  ADD COLUMN reported_ready_replicas INT NOT NULL DEFAULT 0 AFTER reported_desired_replicas,
  ADD COLUMN reported_available_replicas INT NOT NULL DEFAULT 0 AFTER reported_ready_replicas,
  ADD COLUMN reported_deleted BOOLEAN NOT NULL DEFAULT FALSE AFTER reported_available_replicas;
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
INSERT INTO report_guards (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns)
SELECT kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns FROM object_reports;
DROP TABLE object_reports;
