-- Secret environments (ctrl/vault). deployments.encrypted_env holds the
-- sealed blob; the names of the variables are kept beside it (never their
-- values) so the deploy API can show them. vault_audit records every
-- decryption request a cluster makes, allowed or denied.

-- +goose Up
ALTER TABLE deployments
  ADD COLUMN secret_env_keys JSON NULL AFTER encrypted_env;

CREATE TABLE vault_audit (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  deployment_id VARCHAR(64)  NOT NULL,
  cluster_id    VARCHAR(64)  NOT NULL DEFAULT '',
  region        VARCHAR(64)  NOT NULL DEFAULT '',
  token_id      VARCHAR(32)  NOT NULL DEFAULT '',
  -- allowed | denied | failed
  outcome       VARCHAR(16)  NOT NULL,
  -- Why (denied or failed) or with which key (allowed); no secret material.
  reason        VARCHAR(512) NOT NULL DEFAULT '',
  key_id        VARCHAR(64)  NOT NULL DEFAULT '',
  created_at    BIGINT       NOT NULL,
  PRIMARY KEY (id),
  KEY vault_audit_deployment (deployment_id, created_at),
  KEY vault_audit_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE vault_audit;
ALTER TABLE deployments DROP COLUMN secret_env_keys;
