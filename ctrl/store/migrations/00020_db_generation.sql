-- The database's generation: an identity of its history of versions,
-- written when the schema is created and replaced when the database is
-- restored from a backup or replaced by a replica (`ctrl admin db restored`, or
-- by ctrl itself when a stream's cursor is ahead of the head). A krane host
-- whose cursor belongs to another generation bootstraps again: versions
-- are issued again at or below the cursors hosts hold after the database
-- went back in time (ctrl/store/doc.go).

-- +goose Up
CREATE TABLE db_generation (
  id         TINYINT UNSIGNED NOT NULL,
  generation CHAR(32)         NOT NULL,
  reason     VARCHAR(255)     NOT NULL,
  updated_at BIGINT           NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT INTO db_generation (id, generation, reason, updated_at)
VALUES (1, REPLACE(UUID(), '-', ''), 'created', UNIX_TIMESTAMP() * 1000);

-- +goose Down
DROP TABLE db_generation;
