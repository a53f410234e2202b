-- What ctrl knows about its clusters beyond "alive": the controllers each
-- host runs and its parked objects (from its heartbeats), and when each
-- desired-state row got its current version, so that lag can be told in
-- seconds as well as in versions.
--
-- clusters.controllers / clusters.parked are NULL until a host that
-- reports them sends a heartbeat (an older host never does): NULL means
-- "not reported", not "none". They are JSON columns of the clusters row so
-- a heartbeat stays one UPDATE of one row, however many controllers and
-- kinds a host has.
--
-- version_at is unix milliseconds of the stamp that gave the row its
-- current version (the stamp runs in the committing transaction, just
-- before COMMIT); 0 for rows stamped before this migration.

-- +goose Up
ALTER TABLE clusters ADD COLUMN controllers JSON NULL, ADD COLUMN parked JSON NULL;
ALTER TABLE deployment_topology ADD COLUMN version_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sentinels ADD COLUMN version_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cilium_network_policies ADD COLUMN version_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE resources ADD COLUMN version_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE resources DROP COLUMN version_at;
ALTER TABLE cilium_network_policies DROP COLUMN version_at;
ALTER TABLE sentinels DROP COLUMN version_at;
ALTER TABLE deployment_topology DROP COLUMN version_at;
ALTER TABLE clusters DROP COLUMN parked, DROP COLUMN controllers;
