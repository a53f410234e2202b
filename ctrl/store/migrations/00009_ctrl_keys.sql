-- Secrets every ctrl replica must share, created by the first ctrl that
-- needs one (INSERT IGNORE: replicas starting together agree on one).
-- restate-ingress signs ctrl's calls through Restate's ingress: a call of
-- ctrl's gateway without it is refused, so reaching the ingress is not
-- enough to deploy, stamp or wake anything.

-- +goose Up
CREATE TABLE ctrl_keys (
  name       VARCHAR(64)    NOT NULL,
  secret     VARBINARY(64)  NOT NULL,
  created_at BIGINT         NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE ctrl_keys;
