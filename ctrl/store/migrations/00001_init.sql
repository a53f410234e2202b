-- The desired and actual state ctrl keeps for every region.
--
-- Portable between MySQL 8 and MariaDB 10.11: no RETURNING, no reliance on
-- CHECK constraints, every JSON column is JSON (MariaDB stores it as
-- LONGTEXT with a validity check, MySQL as binary JSON; both return text).
-- No foreign keys: desired-state rows are never hard-deleted by ctrl, and
-- parent-row locks taken by foreign-key checks would add lock waits to the
-- version-stamping transactions.
--
-- Times are unix milliseconds (BIGINT) unless the column name ends in _ns
-- (unix nanoseconds; used where two reports may arrive within a millisecond).
-- A `version` of 0 means "never stamped": such a row is invisible to agents.

-- +goose Up
CREATE TABLE version_seq (
  id   TINYINT UNSIGNED NOT NULL,
  head BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO version_seq (id, head) VALUES (1, 0);

CREATE TABLE change_heads (
  region VARCHAR(64)  NOT NULL,
  kind   VARCHAR(128) NOT NULL,
  head   BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (region, kind)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE deployments (
  id               VARCHAR(64)  NOT NULL,
  workspace_id     VARCHAR(64)  NOT NULL,
  project_id       VARCHAR(64)  NOT NULL,
  environment_id   VARCHAR(64)  NOT NULL,
  app_id           VARCHAR(64)  NOT NULL,
  k8s_namespace    VARCHAR(63)  NOT NULL,
  k8s_name         VARCHAR(253) NOT NULL,
  image            VARCHAR(512) NOT NULL,
  cpu_millicores   BIGINT       NOT NULL,
  memory_mib       BIGINT       NOT NULL,
  replicas         INT          NOT NULL,
  env_vars         JSON         NOT NULL,
  encrypted_env    LONGBLOB     NULL,
  healthcheck      JSON         NULL,
  port             INT          NOT NULL DEFAULT 8080,
  command          JSON         NOT NULL,
  shutdown_signal  VARCHAR(16)  NOT NULL DEFAULT 'SIGTERM',
  status           ENUM('pending','deploying','network','ready','failed','stopped') NOT NULL DEFAULT 'pending',
  error            TEXT         NULL,
  idempotency_key  VARCHAR(128) NULL,
  rolled_back_from VARCHAR(64)  NULL,
  created_at       BIGINT       NOT NULL,
  updated_at       BIGINT       NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY deployments_idempotency_key (idempotency_key),
  KEY deployments_environment (environment_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE deployment_topology (
  deployment_id           VARCHAR(64) NOT NULL,
  region                  VARCHAR(64) NOT NULL,
  desired_replicas        INT         NOT NULL,
  desired_status          ENUM('running','stopped') NOT NULL DEFAULT 'running',
  version                 BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_at_ns   BIGINT      NOT NULL DEFAULT 0,
  reported_desired_replicas   INT     NOT NULL DEFAULT 0,
  reported_ready_replicas     INT     NOT NULL DEFAULT 0,
  reported_available_replicas INT     NOT NULL DEFAULT 0,
  reported_deleted        BOOLEAN     NOT NULL DEFAULT FALSE,
  created_at              BIGINT      NOT NULL,
  updated_at              BIGINT      NOT NULL,
  PRIMARY KEY (deployment_id, region),
  KEY deployment_topology_region_version (region, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE instances (
  deployment_id    VARCHAR(64)  NOT NULL,
  region           VARCHAR(64)  NOT NULL,
  cluster_id       VARCHAR(64)  NOT NULL,
  k8s_name         VARCHAR(253) NOT NULL,
  address          VARCHAR(255) NOT NULL DEFAULT '',
  cpu_millicores   BIGINT       NOT NULL DEFAULT 0,
  memory_mib       BIGINT       NOT NULL DEFAULT 0,
  status           ENUM('pending','running','failed','inactive') NOT NULL,
  reason           VARCHAR(255) NOT NULL DEFAULT '',
  message          TEXT         NULL,
  zone             VARCHAR(64)  NOT NULL DEFAULT '',
  observed_version BIGINT UNSIGNED NOT NULL,
  observed_at_ns   BIGINT       NOT NULL,
  updated_at       BIGINT       NOT NULL,
  PRIMARY KEY (deployment_id, region, cluster_id, k8s_name),
  KEY instances_region_cluster (region, cluster_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE sentinels (
  id                      VARCHAR(64)  NOT NULL,
  region                  VARCHAR(64)  NOT NULL,
  workspace_id            VARCHAR(64)  NOT NULL,
  project_id              VARCHAR(64)  NOT NULL,
  app_id                  VARCHAR(64)  NOT NULL,
  environment_id          VARCHAR(64)  NOT NULL,
  k8s_name                VARCHAR(253) NOT NULL,
  image                   VARCHAR(512) NOT NULL,
  replicas                INT          NOT NULL,
  cpu_millicores          BIGINT       NOT NULL,
  memory_mib              BIGINT       NOT NULL,
  desired_state           ENUM('running','stopped') NOT NULL DEFAULT 'running',
  running_image           VARCHAR(512) NOT NULL DEFAULT '',
  available_replicas      INT          NOT NULL DEFAULT 0,
  updated_replicas        INT          NOT NULL DEFAULT 0,
  ready_replicas          INT          NOT NULL DEFAULT 0,
  observed_generation     BIGINT       NOT NULL DEFAULT 0,
  health                  ENUM('unknown','healthy','unhealthy','paused') NOT NULL DEFAULT 'unknown',
  health_reason           VARCHAR(1024) NOT NULL DEFAULT '',
  reported_deleted        BOOLEAN      NOT NULL DEFAULT FALSE,
  deploy_status           ENUM('idle','progressing','ready','failed') NOT NULL DEFAULT 'idle',
  version                 BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_at_ns   BIGINT       NOT NULL DEFAULT 0,
  created_at              BIGINT       NOT NULL,
  updated_at              BIGINT       NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY sentinels_environment_region (environment_id, region),
  KEY sentinels_region_version (region, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE cilium_network_policies (
  id                      VARCHAR(64)  NOT NULL,
  region                  VARCHAR(64)  NOT NULL,
  k8s_namespace           VARCHAR(63)  NOT NULL,
  k8s_name                VARCHAR(253) NOT NULL,
  policy                  JSON         NOT NULL,
  deleted                 BOOLEAN      NOT NULL DEFAULT FALSE,
  version                 BIGINT UNSIGNED NOT NULL DEFAULT 0,
  status_applied          BOOLEAN      NOT NULL DEFAULT FALSE,
  status_message          TEXT         NULL,
  reported_deleted        BOOLEAN      NOT NULL DEFAULT FALSE,
  report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_at_ns   BIGINT       NOT NULL DEFAULT 0,
  created_at              BIGINT       NOT NULL,
  updated_at              BIGINT       NOT NULL,
  PRIMARY KEY (id),
  KEY cilium_network_policies_region_version (region, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE resources (
  kind                    VARCHAR(128) NOT NULL,
  region                  VARCHAR(64)  NOT NULL,
  id                      VARCHAR(253) NOT NULL,
  spec                    JSON         NOT NULL,
  deleted                 BOOLEAN      NOT NULL DEFAULT FALSE,
  version                 BIGINT UNSIGNED NOT NULL DEFAULT 0,
  status                  JSON         NULL,
  report_observed_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  report_observed_at_ns   BIGINT       NOT NULL DEFAULT 0,
  created_at              BIGINT       NOT NULL,
  updated_at              BIGINT       NOT NULL,
  PRIMARY KEY (kind, region, id),
  KEY resources_region_kind_version (region, kind, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE clusters (
  id                VARCHAR(64)  NOT NULL,
  region            VARCHAR(64)  NOT NULL,
  created_at        BIGINT       NOT NULL,
  last_heartbeat_at BIGINT       NOT NULL DEFAULT 0,
  agent_version     VARCHAR(128) NOT NULL DEFAULT '',
  cursors           JSON         NULL,
  PRIMARY KEY (id),
  KEY clusters_region (region)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE api_tokens (
  id          VARCHAR(32)  NOT NULL,
  kind        ENUM('cluster','operator') NOT NULL,
  cluster_id  VARCHAR(64)  NULL,
  region      VARCHAR(64)  NULL,
  name        VARCHAR(255) NOT NULL DEFAULT '',
  secret_hash BINARY(32)   NOT NULL,
  created_at  BIGINT       NOT NULL,
  revoked_at  BIGINT       NULL,
  PRIMARY KEY (id),
  KEY api_tokens_cluster (cluster_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE version_grants (
  invocation_id VARCHAR(255)    NOT NULL,
  first_version BIGINT UNSIGNED NOT NULL,
  last_version  BIGINT UNSIGNED NOT NULL,
  created_at    BIGINT          NOT NULL,
  PRIMARY KEY (invocation_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE version_grants;
DROP TABLE api_tokens;
DROP TABLE clusters;
DROP TABLE resources;
DROP TABLE cilium_network_policies;
DROP TABLE sentinels;
DROP TABLE instances;
DROP TABLE deployment_topology;
DROP TABLE deployments;
DROP TABLE change_heads;
DROP TABLE version_seq;
