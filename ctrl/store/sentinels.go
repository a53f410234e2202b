package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"krane.dev/ctrl/actual"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// Sentinel deploy statuses (sentinels.deploy_status). A SentinelService
// Deploy sets progressing and records itself as the owner
// (deploy_request); only the owner moves it on to ready or failed, with a
// compare-and-set (FinishSentinelDeploy).
const (
	SentinelIdle        = "idle"
	SentinelProgressing = "progressing"
	SentinelReady       = "ready"
	SentinelFailed      = "failed"
)

// SentinelRow is a sentinels row: the desired state, what the cluster last
// reported, and where the last deploy stands.
type SentinelRow struct {
	Sentinel
	Version uint64
	// Actual is what the region's clusters reported, by the aggregation
	// rule (ctrl/actual); Reports the counted clusters' statuses, by
	// cluster id. Set by GetSentinel and ListSentinels only.
	Actual  actual.Region
	Reports []SentinelReport
	// The report of the counted cluster furthest behind (Actual.Behind),
	// the one a single line about the sentinel shows; zero before it
	// reports.
	RunningImage          string
	AvailableReplicas     int32
	UpdatedReplicas       int32
	ReadyReplicas         int32
	ObservedGeneration    int64
	Health                string // unknown, healthy, unhealthy, paused
	HealthReason          string
	ReportedDeleted       bool
	ReportObservedVersion uint64
	// The last SentinelService.Deploy, and whether it changed the
	// configuration.
	DeployStatus  string
	DeployRequest string
	DeployMessage string
	DeployChanged bool
	// EncryptedCredentials is the sentinel's sealed credentials (nil:
	// none); CredentialNames the names of its variables, sorted.
	EncryptedCredentials []byte
	CredentialNames      []string

	CreatedAt, UpdatedAt time.Time
}

// SentinelReport is one cluster's last report on a sentinel.
type SentinelReport struct {
	ClusterID string
	Version   uint64
	Deleted   bool
	Status    *clusterv1.SentinelStatus
}

const sentinelColumns = `id, region, workspace_id, project_id, app_id, environment_id, k8s_name, image, replicas,
  cpu_millicores, memory_mib, desired_state, version, deploy_status, deploy_request, deploy_message, deploy_changed, encrypted_credentials, credential_names, created_at, updated_at`

func scanSentinelRow(s scanner) (SentinelRow, error) {
	var (
		r                SentinelRow
		msg              sql.NullString
		names            []byte
		created, updated int64
	)
	err := s.Scan(&r.ID, &r.Region, &r.WorkspaceID, &r.ProjectID, &r.AppID, &r.EnvironmentID, &r.K8sName, &r.Image, &r.Replicas,
		&r.CPUMillicores, &r.MemoryMiB, &r.DesiredState, &r.Version, &r.DeployStatus, &r.DeployRequest, &msg, &r.DeployChanged, &r.EncryptedCredentials, &names, &created, &updated)
	if err != nil {
		return r, err
	}
	r.DeployMessage = msg.String
	r.CreatedAt, r.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
	if len(names) > 0 {
		if jerr := json.Unmarshal(names, &r.CredentialNames); jerr != nil {
			return r, fmt.Errorf("sentinels.credential_names of %s is not a JSON array of strings: %w", r.ID, jerr)
		}
	}
	r.Health = "unknown"
	return r, nil
}

// attachSentinelReports rolls up each sentinel's reports by the
// aggregation rule.
func (s *Store) attachSentinelReports(ctx context.Context, rows []SentinelRow) error {
	ds := make([]desiredObj, len(rows))
	for i, r := range rows {
		ds[i] = desiredObj{objKey: objKey{kinds.Sentinel, r.Region, r.ID}, version: r.Version, deleted: r.DesiredState != "running"}
	}
	rolled, err := s.rollUp(ctx, ds, nil)
	if err != nil {
		return err
	}
	for i := range rows {
		r := &rows[i]
		r.Actual = rolled[ds[i].objKey]
		for _, rep := range r.Actual.Reports {
			sr := SentinelReport{ClusterID: rep.ClusterID, Version: rep.Version, Deleted: rep.Deleted, Status: &clusterv1.SentinelStatus{}}
			if len(rep.Status) > 0 {
				if err := protojson.Unmarshal(rep.Status, sr.Status); err != nil {
					return fmt.Errorf("store: the report of cluster %s on sentinel %s is not a SentinelStatus: %w", rep.ClusterID, r.ID, err)
				}
			}
			r.Reports = append(r.Reports, sr)
		}
		if id, _, reported, ok := r.Actual.Behind(); ok && reported {
			for _, sr := range r.Reports {
				if sr.ClusterID == id {
					st := sr.Status
					r.RunningImage, r.AvailableReplicas, r.UpdatedReplicas, r.ReadyReplicas = st.GetRunningImage(), st.GetAvailableReplicas(), st.GetUpdatedReplicas(), st.GetReadyReplicas()
					r.ObservedGeneration, r.Health, r.HealthReason = st.GetObservedGeneration(), st.GetHealth().Word(), st.GetReason()
					r.ReportedDeleted, r.ReportObservedVersion = sr.Deleted, sr.Version
				}
			}
		}
	}
	return nil
}

// SetSentinelCredentials replaces a sentinel's sealed credentials (blob,
// sealed by ctrl's vault for the sentinel's id) and the names of their
// variables, and touches the sentinel: its cluster gets the new blob with
// the next version. Only ciphertext comes here.
func (t *Tx) SetSentinelCredentials(ctx context.Context, id, region string, blob []byte, names []string) error {
	if len(blob) == 0 {
		return fmt.Errorf("store: sentinel %s: no sealed credentials to set", id)
	}
	js, err := json.Marshal(names)
	if err != nil {
		return err
	}
	res, err := t.Exec(ctx, "UPDATE sentinels SET encrypted_credentials = ?, credential_names = ?, updated_at = ? WHERE id = ?", blob, js, nowMillis(), id)
	if err != nil {
		return fmt.Errorf("store: set the credentials of sentinel %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: set the credentials of sentinel %s: %w", id, ErrNotFound)
	}
	t.Touch(kinds.Sentinel, region, id)
	return nil
}

// SealedCredentials is what a decryption request for a sentinel is
// checked against.
type SealedCredentials struct {
	// Blob is the sealed credentials stored for the sentinel; nil: none.
	Blob []byte
	// Region is the sentinel's; Running whether it is desired running.
	Region  string
	Running bool
}

// SentinelSealedCredentials reads a sentinel's sealed credentials, its
// region and desired state; ErrNotFound when there is no such sentinel.
func (s *Store) SentinelSealedCredentials(ctx context.Context, id string) (SealedCredentials, error) {
	var (
		c     SealedCredentials
		state string
	)
	err := s.db.QueryRowContext(ctx, "SELECT encrypted_credentials, region, desired_state FROM sentinels WHERE id = ?", id).Scan(&c.Blob, &c.Region, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return SealedCredentials{}, ErrNotFound
	}
	if err != nil {
		return SealedCredentials{}, fmt.Errorf("store: read the sealed credentials of sentinel %s: %w", id, err)
	}
	c.Running = state == "running"
	return c, nil
}

// GetSentinel reads one sentinel from the primary; ErrNotFound when there
// is none.
func (s *Store) GetSentinel(ctx context.Context, id string) (SentinelRow, error) {
	r, err := scanSentinelRow(s.db.QueryRowContext(ctx, "SELECT "+sentinelColumns+" FROM sentinels WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return SentinelRow{}, ErrNotFound
	}
	if err != nil {
		return SentinelRow{}, fmt.Errorf("store: read sentinel %s: %w", id, err)
	}
	rows := []SentinelRow{r}
	if err := s.attachSentinelReports(ctx, rows); err != nil {
		return SentinelRow{}, err
	}
	return rows[0], nil
}

// LockSentinel reads one sentinel and locks its row until the transaction
// ends, so a read-modify-write of its configuration cannot merge over a
// stale row. ErrNotFound when there is none.
func (t *Tx) LockSentinel(ctx context.Context, id string) (SentinelRow, error) {
	r, err := scanSentinelRow(t.QueryRow(ctx, "SELECT "+sentinelColumns+" FROM sentinels WHERE id = ? FOR UPDATE", id))
	if errors.Is(err, sql.ErrNoRows) {
		return SentinelRow{}, ErrNotFound
	}
	if err != nil {
		return SentinelRow{}, fmt.Errorf("store: lock sentinel %s: %w", id, err)
	}
	return r, nil
}

// SetSentinelDeploy records that request owns the sentinel's deploy, now in
// status (progressing, or ready when nothing had to change), whether it
// changed the configuration, and clears the previous deploy's message.
func (t *Tx) SetSentinelDeploy(ctx context.Context, id, request, status string, changed bool) error {
	res, err := t.Exec(ctx, "UPDATE sentinels SET deploy_status = ?, deploy_request = ?, deploy_message = NULL, deploy_changed = ?, updated_at = ? WHERE id = ?",
		status, request, changed, nowMillis(), id)
	if err != nil {
		return fmt.Errorf("store: start deploy of sentinel %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: start deploy of sentinel %s: %w", id, ErrNotFound)
	}
	return nil
}

// FinishSentinelDeploy moves a sentinel's deploy from progressing to status
// (ready or failed) with message, provided request still owns it. It
// returns whether it changed the row and the deploy status afterwards. A
// repeated call (a retried step) changes nothing and reports the status it
// finds.
func (s *Store) FinishSentinelDeploy(ctx context.Context, id, request, status, message string) (changed bool, current string, err error) {
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.Exec(ctx, `UPDATE sentinels SET deploy_status = ?, deploy_message = ?, updated_at = ?
WHERE id = ? AND deploy_request = ? AND deploy_status = 'progressing'`, status, nullString(message), nowMillis(), id, request)
		if err != nil {
			return fmt.Errorf("store: finish deploy of sentinel %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			changed, current = true, status
			return nil
		}
		changed = false
		err = tx.QueryRow(ctx, "SELECT deploy_status FROM sentinels WHERE id = ?", id).Scan(&current)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("store: read deploy status of sentinel %s: %w", id, err)
		}
		return nil
	})
	return changed, current, err
}

// SentinelFilter narrows ListSentinels; empty fields match everything.
type SentinelFilter struct {
	Region, EnvironmentID string
}

// ListSentinels returns up to limit sentinels with id > after, in id order.
func (s *Store) ListSentinels(ctx context.Context, f SentinelFilter, after string, limit int) ([]SentinelRow, error) {
	var where []string
	var args []any
	if f.Region != "" {
		where, args = append(where, "region = ?"), append(args, f.Region)
	}
	if f.EnvironmentID != "" {
		where, args = append(where, "environment_id = ?"), append(args, f.EnvironmentID)
	}
	where, args = append(where, "id > ?"), append(args, after, limit)
	rows, err := s.db.QueryContext(ctx, "SELECT "+sentinelColumns+" FROM sentinels WHERE "+strings.Join(where, " AND ")+" ORDER BY id LIMIT ?", args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sentinels: %w", err)
	}
	defer rows.Close()
	var out []SentinelRow
	for rows.Next() {
		r, err := scanSentinelRow(rows)
		if err != nil {
			return nil, fmt.Errorf("store: scan sentinel: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	if err := s.attachSentinelReports(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// SentinelImage is a sentinel's id and desired image, and whether it is
// stopped.
type SentinelImage struct {
	ID      string `json:"id"`
	Image   string `json:"image"`
	Stopped bool   `json:"stopped,omitempty"`
}

// RolloutSentinels returns up to limit sentinels, running or stopped,
// with id > after, in id order (keyset pages for a fleet rollout, which
// sets the image of stopped sentinels too: they start on it).
func (s *Store) RolloutSentinels(ctx context.Context, after string, limit int) ([]SentinelImage, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT id, image, desired_state FROM sentinels WHERE id > ? ORDER BY id LIMIT ?", after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list sentinels: %w", err)
	}
	defer rows.Close()
	var out []SentinelImage
	for rows.Next() {
		var si SentinelImage
		var state string
		if err := rows.Scan(&si.ID, &si.Image, &state); err != nil {
			return nil, err
		}
		si.Stopped = state != "running"
		out = append(out, si)
	}
	return out, rows.Err()
}

// SentinelsDeploying returns up to limit sentinels whose deploy is in
// progress, after the position after (the zero value starts at the least
// recently changed), least recently changed first.
func (s *Store) SentinelsDeploying(ctx context.Context, after Updated, limit int) ([]Updated, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, updated_at FROM sentinels WHERE deploy_status = 'progressing'
  AND (updated_at > ? OR (updated_at = ? AND id > ?)) ORDER BY updated_at, id LIMIT ?`, after.At, after.At, after.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list deploying sentinels: %w", err)
	}
	return scanUpdated(rows)
}

// SentinelWait is a sentinel a deploy waits for before its deployment may
// become ready: one the deploy created or set running again (Ensured), or
// one another deploy created that has not been ready yet while its
// environment has no live deployment (nothing routes through it yet, and
// this deploy may become the first live one).
type SentinelWait struct {
	ID      string `json:"id"`
	Region  string `json:"region"`
	Ensured bool   `json:"ensured,omitempty"`
}

// Note is the deployment-history entry of the wait.
func (w SentinelWait) Note() string {
	if w.Ensured {
		return fmt.Sprintf("waiting for sentinel %s in region %s", w.ID, w.Region)
	}
	return fmt.Sprintf("waiting for sentinel %s in region %s (created by another deploy, not ready yet)", w.ID, w.Region)
}

// ReadyNote is the deployment-history entry when the wait for the
// sentinel ended ready.
func (w SentinelWait) ReadyNote() string {
	return fmt.Sprintf("sentinel %s ready in region %s", w.ID, w.Region)
}

// NoteDeploymentOnce files each message, in order and in one transaction,
// in a deployment's history under its current status, unless an entry
// with that message is there already: a step that runs twice notes once.
func (s *Store) NoteDeploymentOnce(ctx context.Context, id string, messages ...string) error {
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		for _, m := range messages {
			if err := tx.noteOnce(ctx, id, m); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func (t *Tx) noteOnce(ctx context.Context, id, message string) error {
	status, err := t.LockDeployment(ctx, id)
	if err != nil {
		return err
	}
	var n int
	if err := t.QueryRow(ctx, "SELECT COUNT(*) FROM deployment_events WHERE deployment_id = ? AND message = ?", id, message).Scan(&n); err != nil {
		return fmt.Errorf("store: read history of deployment %s: %w", id, err)
	}
	if n > 0 {
		return nil
	}
	return t.RecordEvent(ctx, id, status, message)
}

// liveDeploymentNoLock is an environment's live deployment ("" when none),
// read without locking the environment's row.
func (t *Tx) liveDeploymentNoLock(ctx context.Context, environmentID string) (string, error) {
	var live sql.NullString
	err := t.QueryRow(ctx, "SELECT live_deployment_id FROM environments WHERE id = ?", environmentID).Scan(&live)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: read live deployment of environment %s: %w", environmentID, err)
	}
	return live.String, nil
}

// StopSentinel sets a sentinel's desired state to stopped with a new
// version (a soft delete: the row stays, its cluster deletes the
// sentinel's objects). A sentinel stopped already is left as it is. It
// returns the row afterwards and whether this call stopped it;
// ErrNotFound when there is no such sentinel.
func (s *Store) StopSentinel(ctx context.Context, id string) (SentinelRow, bool, error) {
	var changed bool
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		row, err := tx.LockSentinel(ctx, id)
		if err != nil {
			return err
		}
		changed = row.DesiredState == "running"
		if changed {
			return tx.stopSentinel(ctx, row)
		}
		return nil
	})
	if err != nil {
		return SentinelRow{}, false, err
	}
	row, err := s.GetSentinel(ctx, id)
	return row, changed, err
}

func (t *Tx) stopSentinel(ctx context.Context, row SentinelRow) error {
	if _, err := t.Exec(ctx, "UPDATE sentinels SET desired_state = 'stopped', updated_at = ? WHERE id = ?", nowMillis(), row.ID); err != nil {
		return fmt.Errorf("store: stop sentinel %s: %w", row.ID, err)
	}
	t.Touch(kinds.Sentinel, row.Region, row.ID)
	return nil
}

// unusedSentinelCond holds for a sentinel (alias s) that nothing needs
// since quietSince (2 args, both quietSince in ms): it runs, no deploy of
// it is in progress, it was not changed since, its environment has no
// deployment in progress (in any region) and none that changed since, and
// the environment's live deployment (if any) does not run in its region.
const unusedSentinelCond = `s.desired_state = 'running' AND s.deploy_status <> 'progressing' AND s.updated_at < ?
  AND NOT EXISTS (SELECT 1 FROM deployments d WHERE d.environment_id = s.environment_id
    AND (d.status IN ('pending', 'deploying', 'network') OR d.updated_at >= ?))
  AND NOT EXISTS (SELECT 1 FROM environments e JOIN deployment_topology dt ON dt.deployment_id = e.live_deployment_id
    WHERE e.id = s.environment_id AND dt.region = s.region AND dt.desired_status = 'running')`

// UnusedSentinels returns up to limit ids (> after, in id order) of
// sentinels nothing has needed since quietSince: running, not deploying,
// unchanged since then, in an environment with no deployment in progress,
// none changed since then, and no live deployment in the sentinel's
// region. StopUnusedSentinel stops one after checking again.
func (s *Store) UnusedSentinels(ctx context.Context, quietSince time.Time, after string, limit int) ([]string, error) {
	since := quietSince.UnixMilli()
	rows, err := s.db.QueryContext(ctx, "SELECT s.id FROM sentinels s WHERE "+unusedSentinelCond+" AND s.id > ? ORDER BY s.id LIMIT ?", since, since, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list unused sentinels: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// StopUnusedSentinel stops the sentinel (as StopSentinel) if it is still
// unused since quietSince, checked under its row lock: a deploy that
// ensures the environment's sentinel locks the same row, so the two are
// ordered, and whichever comes second sees the other's work (a deploy
// after the stop sets it running again). It reports whether it stopped it.
func (s *Store) StopUnusedSentinel(ctx context.Context, id string, quietSince time.Time) (bool, error) {
	since := quietSince.UnixMilli()
	var stopped bool
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		stopped = false
		row, err := tx.LockSentinel(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM sentinels s WHERE s.id = ? AND "+unusedSentinelCond, id, since, since).Scan(&n); err != nil {
			return fmt.Errorf("store: check sentinel %s is unused: %w", id, err)
		}
		if n == 0 {
			return nil
		}
		stopped = true
		return tx.stopSentinel(ctx, row)
	})
	return stopped, err
}
