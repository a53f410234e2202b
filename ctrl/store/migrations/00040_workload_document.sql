-- A deployment's workload is one JSON document instead of a column per
-- field: deployments.workload is {"version": 1, "workload": {...}}, the
-- krane.cluster.v1.Workload message in protojson with its proto field
-- names (ctrl/store/workload.go). A field added to the message needs no
-- migration. The columns queries need stay beside it: ids, names,
-- replicas (the scale), status, the sealed environment and its names.
--
-- The moved data: each row's image, command, env_vars, cpu_millicores,
-- memory_mib, port, healthcheck (NULL: none) and shutdown_signal become
-- its document, under the same names. Down moves them back (protojson
-- leaves out what is empty or 0; those get the old columns' defaults).

-- +goose Up
ALTER TABLE deployments ADD COLUMN workload JSON NULL AFTER replicas;

UPDATE deployments SET workload = JSON_OBJECT('version', 1, 'workload', JSON_OBJECT(
  'image', image,
  'command', JSON_EXTRACT(command, '$'),
  'env_vars', JSON_EXTRACT(env_vars, '$'),
  'cpu_millicores', cpu_millicores,
  'memory_mib', memory_mib,
  'port', port,
  'healthcheck', JSON_EXTRACT(healthcheck, '$'),
  'shutdown_signal', shutdown_signal));

ALTER TABLE deployments
  MODIFY COLUMN workload JSON NOT NULL,
  DROP COLUMN image,
  DROP COLUMN command,
  DROP COLUMN env_vars,
  DROP COLUMN cpu_millicores,
  DROP COLUMN memory_mib,
  DROP COLUMN port,
  DROP COLUMN healthcheck,
  DROP COLUMN shutdown_signal;

-- +goose Down
ALTER TABLE deployments
  ADD COLUMN image           VARCHAR(512) NOT NULL DEFAULT '' AFTER k8s_name,
  ADD COLUMN cpu_millicores  BIGINT       NOT NULL DEFAULT 0 AFTER image,
  ADD COLUMN memory_mib      BIGINT       NOT NULL DEFAULT 0 AFTER cpu_millicores,
  ADD COLUMN env_vars        JSON         NULL AFTER replicas,
  ADD COLUMN healthcheck     JSON         NULL AFTER secret_env_keys,
  ADD COLUMN port            INT          NOT NULL DEFAULT 8080 AFTER healthcheck,
  ADD COLUMN command         JSON         NULL AFTER port,
  ADD COLUMN shutdown_signal VARCHAR(16)  NOT NULL DEFAULT 'SIGTERM' AFTER command;

UPDATE deployments SET
  image = COALESCE(JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.image')), ''),
  cpu_millicores = COALESCE(JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.cpu_millicores')), 0),
  memory_mib = COALESCE(JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.memory_mib')), 0),
  env_vars = COALESCE(JSON_EXTRACT(workload, '$.workload.env_vars'), JSON_OBJECT()),
  healthcheck = JSON_EXTRACT(workload, '$.workload.healthcheck'),
  port = COALESCE(JSON_EXTRACT(workload, '$.workload.port'), 8080),
  command = COALESCE(JSON_EXTRACT(workload, '$.workload.command'), JSON_ARRAY()),
  shutdown_signal = COALESCE(JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.shutdown_signal')), 'SIGTERM');

ALTER TABLE deployments
  MODIFY COLUMN image    VARCHAR(512) NOT NULL,
  MODIFY COLUMN cpu_millicores BIGINT NOT NULL,
  MODIFY COLUMN memory_mib BIGINT NOT NULL,
  MODIFY COLUMN env_vars JSON NOT NULL,
  MODIFY COLUMN command  JSON NOT NULL,
  DROP COLUMN workload;
