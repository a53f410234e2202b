-- Kinds plugin authors register for the resource API: each with the JSON
-- Schema (draft 2020-12) of its spec, which ctrl checks every put against
-- before anything reaches a cluster. The built-in kinds have their own
-- tables and schemas and no row here. The resource API reads an object's
-- rows in every region by (kind, id): resources_kind_id serves that.

-- +goose Up
CREATE TABLE resource_kinds (
  kind        VARCHAR(128)  NOT NULL,
  spec_schema JSON          NOT NULL,
  description VARCHAR(1024) NOT NULL DEFAULT '',
  created_at  BIGINT        NOT NULL,
  updated_at  BIGINT        NOT NULL,
  PRIMARY KEY (kind)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE resources ADD KEY resources_kind_id (kind, id);

-- +goose Down
ALTER TABLE resources DROP KEY resources_kind_id;
DROP TABLE resource_kinds;
