-- krane:phase expand
--
-- What contract steps require of the ctrl that serves the schema after
-- them: before applying a contract step (a drop of what the previous
-- release no longer reads), the migrator records here the oldest ctrl
-- line that can serve the schema without it. A ctrl older than the newest
-- requirement says so and stays unready instead of failing queries
-- (store.SchemaStatus, docs/compatibility.md). Rows are kept: the history
-- of what each contract step required.

-- +goose Up
CREATE TABLE schema_requirements (
  migration   BIGINT      NOT NULL,
  min_ctrl    VARCHAR(32) NOT NULL,
  recorded_at BIGINT      NOT NULL,
  PRIMARY KEY (migration)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE schema_requirements;
