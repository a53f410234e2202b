-- Sentinel credentials (database, ClickHouse, Redis, ...), sealed by ctrl's
-- vault for the sentinel's id exactly like a deployment's secret
-- environment. encrypted_credentials holds the sealed blob (NULL: none);
-- credential_names the names of the variables (never their values) so the
-- sentinel API can show them. The plaintext is never stored.

-- +goose Up
ALTER TABLE sentinels
  ADD COLUMN encrypted_credentials MEDIUMBLOB NULL AFTER desired_state,
  ADD COLUMN credential_names JSON NULL AFTER encrypted_credentials;

-- +goose Down
ALTER TABLE sentinels
  DROP COLUMN credential_names,
  DROP COLUMN encrypted_credentials;
