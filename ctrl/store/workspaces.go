package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"krane.dev/ctrl/deployspec"
)

// ErrNamespaceHeld: the namespace a workspace maps to holds another
// workspace's deployments.
var ErrNamespaceHeld = errors.New("namespace held by another workspace")

// WorkspaceNamespace is the namespace a new deployment of workspace goes
// to. Namespaces are per workspace and stored per deployment
// (k8s_namespace), so a change of deployspec.Namespace never moves what
// runs: a workspace keeps the namespace of its newest deployment. Two
// workspaces never share one:
//
//   - A workspace keeps its stored namespace when no other workspace holds
//     it, or when deployspec.Namespace maps it there (any other holder got
//     it from the old mapping's collision and moves at its next deploy).
//   - Otherwise (a new workspace, or one that joined another's namespace
//     under the old mapping) it gets deployspec.Namespace, unless another
//     workspace holds that: then the create is refused and nothing shares.
func (s *Store) WorkspaceNamespace(ctx context.Context, workspaceID string) (string, error) {
	mapped := deployspec.Namespace(workspaceID)
	var stored string
	err := s.db.QueryRowContext(ctx, `SELECT k8s_namespace FROM deployments WHERE workspace_id = ? ORDER BY created_at DESC, id DESC LIMIT 1`, workspaceID).Scan(&stored)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("read the namespace of workspace %q: %w", workspaceID, err)
	}
	if stored != "" {
		other, err := s.otherHolder(ctx, stored, workspaceID)
		if err != nil {
			return "", err
		}
		if other == "" || stored == mapped {
			return stored, nil
		}
	}
	other, err := s.otherHolder(ctx, mapped, workspaceID)
	if err != nil {
		return "", err
	}
	if other != "" {
		return "", fmt.Errorf("%w: workspace %q maps to namespace %s, which workspace %q already holds, and no deployment of %q is created there (delete %q's deployments in %s, or deploy under another workspace id)",
			ErrNamespaceHeld, workspaceID, mapped, other, workspaceID, other, mapped)
	}
	return mapped, nil
}

// otherHolder names a workspace other than workspaceID with a deployment
// in ns, "" when there is none.
func (s *Store) otherHolder(ctx context.Context, ns, workspaceID string) (string, error) {
	var other string
	err := s.db.QueryRowContext(ctx, `SELECT workspace_id FROM deployments WHERE k8s_namespace = ? AND workspace_id <> ? LIMIT 1`, ns, workspaceID).Scan(&other)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("read who holds namespace %s: %w", ns, err)
	}
	return other, nil
}
