-- krane:phase expand
--
-- Finding a workspace's namespace, and who else holds a namespace, without
-- scanning deployments (store.WorkspaceNamespace, at every
-- CreateDeployment).

-- +goose Up
ALTER TABLE deployments
  ADD KEY deployments_workspace (workspace_id, created_at),
  ADD KEY deployments_namespace (k8s_namespace, workspace_id),
  ALGORITHM=INPLACE, LOCK=NONE;

-- +goose Down
ALTER TABLE deployments
  DROP KEY deployments_namespace,
  DROP KEY deployments_workspace;
