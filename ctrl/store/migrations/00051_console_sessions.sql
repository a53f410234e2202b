-- Signed-in sessions of the web console, shared by every ctrl replica so
-- the console works behind a plain Service. The browser's cookie holds a
-- random secret; a row holds only its SHA-256 (the key) and the operator
-- token sealed with a key derived from that secret, so the table alone
-- neither signs anyone in nor reveals a token. Signing out deletes the
-- row: every replica refuses the cookie from then on.

-- +goose Up
CREATE TABLE console_sessions (
  id_hash      BINARY(32)     NOT NULL,
  token_id     VARCHAR(32)    NOT NULL,
  sealed_token VARBINARY(512) NOT NULL,
  flash_kind   VARCHAR(8)     NOT NULL DEFAULT '',
  flash_text   VARCHAR(2048)  NOT NULL DEFAULT '',
  created_at   BIGINT         NOT NULL,
  expires_at   BIGINT         NOT NULL,
  PRIMARY KEY (id_hash),
  KEY console_sessions_expires (expires_at),
  KEY console_sessions_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE console_sessions;
