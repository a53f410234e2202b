package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"krane.dev/ctrl/actual"
	"krane.dev/shared/kinds"
)

// This file loads the inputs of the aggregation rule (ctrl/actual) and
// hands back its result: every reader of actual state goes through
// rollUp, so none of them has a rule of its own.

// desiredObj is an object's desired version and state in one region.
type desiredObj struct {
	objKey
	version uint64
	deleted bool
}

// rollUp applies the rule to each of objs: one read of their reports, one
// of their apply errors (unless errs is given), one of their regions'
// clusters.
func (s *Store) rollUp(ctx context.Context, objs []desiredObj, errs map[objKey][]ApplyError) (map[objKey]actual.Region, error) {
	out := make(map[objKey]actual.Region, len(objs))
	if len(objs) == 0 {
		return out, nil
	}
	var regions []string
	keys := make([]objKey, len(objs))
	for i, o := range objs {
		keys[i] = o.objKey
		if !slices.Contains(regions, o.region) {
			regions = append(regions, o.region)
		}
	}
	clusters, err := s.ruleClusters(ctx, regions)
	if err != nil {
		return nil, err
	}
	reports, err := s.reportsOf(ctx, keys)
	if err != nil {
		return nil, err
	}
	if errs == nil {
		if errs, err = s.applyErrorsByObject(ctx, keys); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	for _, o := range objs {
		var aes []actual.Error
		for _, e := range errs[o.objKey] {
			aes = append(aes, actual.Error{ClusterID: e.ClusterID, Version: e.Version, Message: e.Message, Field: e.Field, Permanent: e.Permanent})
		}
		out[o.objKey] = actual.RollUp(o.kind, o.version, o.deleted, clusters[o.region], reports[o.objKey], aes, now)
	}
	return out, nil
}

// ruleClusters reads the registered clusters of regions, as the rule sees
// them, by region. Only clusters with a valid token are read: one without
// cannot report or heartbeat.
func (s *Store) ruleClusters(ctx context.Context, regions []string) (map[string][]actual.Cluster, error) {
	cs, err := s.ClustersIn(ctx, regions)
	if err != nil {
		return nil, err
	}
	out := map[string][]actual.Cluster{}
	for _, c := range cs {
		out[c.Region] = append(out[c.Region], RuleCluster(c.ID, c.Region, c.LastHeartbeatAt, c.Host))
	}
	return out, nil
}

// RuleCluster is a cluster as the aggregation rule sees it: its last
// heartbeat and the kinds its host serves (HostReport.Serves: its enabled
// controllers', running or not; host nil: its heartbeats do not say).
func RuleCluster(id, region string, lastHeartbeat time.Time, host *HostReport) actual.Cluster {
	c := actual.Cluster{ID: id, Region: region, LastHeartbeat: lastHeartbeat, KindsReported: host != nil}
	if host != nil {
		for _, ctl := range host.Controllers {
			c.Kinds = append(c.Kinds, ctl.Kinds...)
			if k := kinds.OfBuiltInController(ctl.Name); len(ctl.Kinds) == 0 && k != "" {
				c.Kinds = append(c.Kinds, k)
			}
		}
	}
	return c
}

// reportsOf reads the clusters' reports on objects: one statement per
// kind.
func (s *Store) reportsOf(ctx context.Context, keys []objKey) (map[objKey][]actual.Report, error) {
	out := map[objKey][]actual.Report{}
	for kind, group := range groupByKind(keys) {
		ids, regions := distinct(group, func(k objKey) string { return k.id }), distinct(group, func(k objKey) string { return k.region })
		args := append(append([]any{kind}, regions...), ids...)
		rows, err := s.db.QueryContext(ctx, `SELECT region, id, cluster_id, observed_version, observed_at_ns, deleted, status FROM object_reports
WHERE kind = ? AND region IN (`+placeholders(len(regions))+") AND id IN ("+placeholders(len(ids))+")", args...)
		if err != nil {
			return nil, fmt.Errorf("store: read the reports on %d %s objects: %w", len(ids), kind, err)
		}
		for rows.Next() {
			k := objKey{kind: kind}
			var r actual.Report
			var at int64
			var status []byte
			if err := rows.Scan(&k.region, &k.id, &r.ClusterID, &r.Version, &at, &r.Deleted, &status); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: read the reports on %s objects: %w", kind, err)
			}
			r.At, r.Status = time.Unix(0, at), canonicalOrRaw(status)
			out[k] = append(out[k], r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: read the reports on %s objects: %w", kind, err)
		}
	}
	return out, nil
}

// applyErrorsByObject reads the apply errors of objects: one statement
// per kind.
func (s *Store) applyErrorsByObject(ctx context.Context, keys []objKey) (map[objKey][]ApplyError, error) {
	out := map[objKey][]ApplyError{}
	for kind, group := range groupByKind(keys) {
		ids, regions := distinct(group, func(k objKey) string { return k.id }), distinct(group, func(k objKey) string { return k.region })
		args := append(append([]any{kind}, regions...), ids...)
		rows, err := s.db.QueryContext(ctx, `SELECT kind, region, id, cluster_id, version, message, field, permanent, updated_at
FROM apply_errors WHERE kind = ? AND region IN (`+placeholders(len(regions))+") AND id IN ("+placeholders(len(ids))+") ORDER BY kind, region, id, cluster_id", args...)
		if err != nil {
			return nil, fmt.Errorf("store: read the apply errors of %d %s objects: %w", len(ids), kind, err)
		}
		errs, err := scanApplyErrors(rows)
		if err != nil {
			return nil, fmt.Errorf("store: read the apply errors of %s objects: %w", kind, err)
		}
		for _, e := range errs {
			k := objKey{e.Kind, e.Region, e.ID}
			out[k] = append(out[k], e)
		}
	}
	return out, nil
}

func groupByKind(keys []objKey) map[string][]objKey {
	out := map[string][]objKey{}
	for _, k := range keys {
		out[k.kind] = append(out[k.kind], k)
	}
	return out
}

func distinct[T any](xs []T, f func(T) string) []any {
	seen := map[string]bool{}
	var out []any
	for _, x := range xs {
		if v := f(x); !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// ObjectReport is one cluster's last report on an object, for
// inspection.
type ObjectReport struct {
	ClusterID string
	Version   uint64
	At        time.Time
	Deleted   bool
	Status    []byte
}

// ObjectReports lists every cluster's stored report on one object of a
// region, by cluster id, whether the cluster counts or not.
func (s *Store) ObjectReports(ctx context.Context, kind, region, id string) ([]ObjectReport, error) {
	reps, err := s.reportsOf(ctx, []objKey{{kind, region, id}})
	if err != nil {
		return nil, err
	}
	var out []ObjectReport
	for _, r := range reps[objKey{kind, region, id}] {
		out = append(out, ObjectReport(r))
	}
	slices.SortFunc(out, func(a, b ObjectReport) int { return cmpString(a.ClusterID, b.ClusterID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ActualStateRows counts the rows of every actual-state table (for tests
// and the fleet bench: they must stay bounded).
func (s *Store) ActualStateRows(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	for _, table := range []string{"object_reports", "instances", "apply_errors"} {
		var n int64
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil && err != sql.ErrNoRows {
			return nil, fmt.Errorf("store: count the rows of %s: %w", table, err)
		}
		out[table] = n
	}
	return out, nil
}
