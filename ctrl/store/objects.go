package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"krane.dev/ctrl/actual"
	"krane.dev/shared/kinds"
)

// This file is the store side of the operators' resource API: objects of
// the kinds plugin authors register (the generic resources table) and of
// ciliumnetworkpolicy, each a spec desired in a set of regions, written
// through the same versioned transactions (WriteTx) as every other
// desired-state change, and read back with what each region's clusters
// reported.

// KindRegistration is a kind registered for the resource API.
type KindRegistration struct {
	Kind string
	// SpecSchema is the JSON Schema (draft 2020-12) every spec must pass.
	SpecSchema           string
	Description          string
	CreatedAt, UpdatedAt time.Time
}

// RegisterKind records (or replaces) a kind's registration; created says
// whether it is new. The schema must be valid JSON (the caller compiles it).
func (s *Store) RegisterKind(ctx context.Context, k KindRegistration) (created bool, err error) {
	if IsBuiltIn(k.Kind) || !ValidKind(k.Kind) {
		return false, fmt.Errorf("store: %q cannot be registered (built in, or not a valid kind name)", k.Kind)
	}
	if !json.Valid([]byte(k.SpecSchema)) {
		return false, fmt.Errorf("store: the spec schema of kind %s is not JSON", k.Kind)
	}
	now := nowMillis()
	res, err := s.db.ExecContext(ctx, `INSERT INTO resource_kinds (kind, spec_schema, description, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE spec_schema = VALUES(spec_schema), description = VALUES(description), updated_at = VALUES(updated_at)`,
		k.Kind, k.SpecSchema, k.Description, now, now)
	if err != nil {
		return false, fmt.Errorf("store: register kind %s: %w", k.Kind, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil // MySQL counts an update of an existing row as 2
}

// GetKind returns a kind's registration; ErrNotFound when it has none.
func (s *Store) GetKind(ctx context.Context, kind string) (KindRegistration, error) {
	row := s.db.QueryRowContext(ctx, "SELECT kind, spec_schema, description, created_at, updated_at FROM resource_kinds WHERE kind = ?", kind)
	k, err := scanKind(row)
	if errors.Is(err, sql.ErrNoRows) {
		return KindRegistration{}, ErrNotFound
	}
	return k, err
}

// ListKinds returns every registered kind, by name.
func (s *Store) ListKinds(ctx context.Context) ([]KindRegistration, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT kind, spec_schema, description, created_at, updated_at FROM resource_kinds ORDER BY kind")
	if err != nil {
		return nil, fmt.Errorf("store: list kinds: %w", err)
	}
	defer rows.Close()
	var out []KindRegistration
	for rows.Next() {
		k, err := scanKind(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func scanKind(s scanner) (KindRegistration, error) {
	var k KindRegistration
	var created, updated int64
	if err := s.Scan(&k.Kind, &k.SpecSchema, &k.Description, &created, &updated); err != nil {
		return k, err
	}
	k.CreatedAt, k.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return k, nil
}

// Object is one object of the resource API: its rows, one per region it
// was ever desired in.
type Object struct {
	Kind, ID string
	Regions  []ObjectRegion
}

// ObjectRegion is an object's row in one region, with what its clusters
// reported.
type ObjectRegion struct {
	Region  string
	Version uint64
	Deleted bool
	// Spec is the canonical JSON of the desired spec.
	Spec []byte
	// Actual is what the region's clusters reported, by the aggregation
	// rule (ctrl/actual).
	Actual actual.Region
	// ObservedVersion is Actual.Lowest: the lowest version a counted
	// cluster reported. ObservedAt and Status are the report of the
	// counted cluster furthest behind (Actual.Behind); Status is nil
	// before it reports.
	ObservedVersion uint64
	ObservedAt      time.Time
	Status          []byte
	// Errors are the clusters' apply errors (parked or retrying), of every
	// cluster of the region, counted or not.
	Errors []ApplyError
}

// Spec is the spec of the object's newest live row (or newest row).
func (o Object) Spec() []byte {
	var best *ObjectRegion
	for i := range o.Regions {
		r := &o.Regions[i]
		if best == nil || !r.Deleted && best.Deleted || r.Deleted == best.Deleted && r.Version > best.Version {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	return best.Spec
}

// Live reports whether the object is desired in any region.
func (o Object) Live() bool {
	return slices.ContainsFunc(o.Regions, func(r ObjectRegion) bool { return !r.Deleted })
}

// CanonicalJSON re-encodes a JSON document with sorted keys and no
// insignificant space, so equal documents compare equal as bytes.
func CanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// RefusedError is a write refused because of what was asked (a rule of
// the data), not because the database failed.
type RefusedError struct{ msg string }

func (e *RefusedError) Error() string { return e.msg }

// Refused marks it as api.Refused: ctrl's APIs answer it as
// INVALID_ARGUMENT.
func (e *RefusedError) Refused() {}

func refused(format string, args ...any) error {
	return &RefusedError{msg: fmt.Sprintf(format, args...)}
}

// objectTable is how the objects of one family of kinds map onto SQL.
type objectTable struct {
	// rows reads an object's rows (FOR UPDATE inside a write).
	rows func(ctx context.Context, q querier, kind, id string, lock bool) ([]ObjectRegion, error)
	// write stores one row's content and touches it.
	write func(ctx context.Context, t *Tx, kind, id, region string, spec []byte, deleted bool) error
	// oneRegion: an id lives in one region only (its table's key is the id).
	oneRegion bool
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func objectTableOf(kind string) (*objectTable, error) {
	switch {
	case kind == kinds.CiliumNetworkPolicy:
		return ciliumObjects, nil
	case IsBuiltIn(kind):
		return nil, refused("kind %s has an API of its own, not the resource API", kind)
	}
	return genericObjects, nil
}

var genericObjects = &objectTable{
	rows: func(ctx context.Context, q querier, kind, id string, lock bool) ([]ObjectRegion, error) {
		query := `SELECT region, version, deleted, spec FROM resources WHERE kind = ? AND id = ? ORDER BY region`
		if lock {
			query += " FOR UPDATE"
		}
		rows, err := q.QueryContext(ctx, query, kind, id)
		if err != nil {
			return nil, fmt.Errorf("store: read %s %s: %w", kind, id, err)
		}
		defer rows.Close()
		var out []ObjectRegion
		for rows.Next() {
			var r ObjectRegion
			var spec []byte
			if err := rows.Scan(&r.Region, &r.Version, &r.Deleted, &spec); err != nil {
				return nil, err
			}
			r.Spec = canonicalOrRaw(spec)
			out = append(out, r)
		}
		return out, rows.Err()
	},
	write: func(ctx context.Context, t *Tx, kind, id, region string, spec []byte, deleted bool) error {
		return t.PutResource(ctx, Resource{Kind: kind, Region: region, ID: id, Spec: spec, Deleted: deleted})
	},
}

// CiliumPolicySpec is a ciliumnetworkpolicy's spec in the resource API.
type CiliumPolicySpec struct {
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Policy    json.RawMessage `json:"policy"`
}

var ciliumObjects = &objectTable{
	oneRegion: true,
	rows: func(ctx context.Context, q querier, _, id string, lock bool) ([]ObjectRegion, error) {
		query := `SELECT region, version, deleted, k8s_namespace, k8s_name, policy FROM cilium_network_policies WHERE id = ?`
		if lock {
			query += " FOR UPDATE"
		}
		rows, err := q.QueryContext(ctx, query, id)
		if err != nil {
			return nil, fmt.Errorf("store: read ciliumnetworkpolicy %s: %w", id, err)
		}
		defer rows.Close()
		var out []ObjectRegion
		for rows.Next() {
			var r ObjectRegion
			var spec CiliumPolicySpec
			if err := rows.Scan(&r.Region, &r.Version, &r.Deleted, &spec.Namespace, &spec.Name, &spec.Policy); err != nil {
				return nil, err
			}
			spec.Policy = canonicalOrRaw(spec.Policy)
			r.Spec, _ = json.Marshal(spec)
			out = append(out, r)
		}
		return out, rows.Err()
	},
	write: func(ctx context.Context, t *Tx, _, id, region string, spec []byte, deleted bool) error {
		var s CiliumPolicySpec
		if err := json.Unmarshal(spec, &s); err != nil {
			return fmt.Errorf("store: ciliumnetworkpolicy %s: spec: %w", id, err)
		}
		return t.PutCiliumNetworkPolicy(ctx, CiliumNetworkPolicy{ID: id, Region: region, K8sNamespace: s.Namespace, K8sName: s.Name, Policy: s.Policy, Deleted: deleted})
	},
}

func canonicalOrRaw(doc []byte) []byte {
	if len(doc) == 0 {
		return nil
	}
	if c, err := CanonicalJSON(doc); err == nil {
		return c
	}
	return doc
}

// Change of one region by a put or delete.
type RegionChange struct {
	Region string
	// What: "create" (a new row), "update" (new content), "undelete",
	// "delete", or "unchanged".
	What string
}

// planPut says what putting spec in exactly regions does to rows.
func planPut(rows []ObjectRegion, spec []byte, regions []string) []RegionChange {
	have := map[string]ObjectRegion{}
	for _, r := range rows {
		have[r.Region] = r
	}
	var out []RegionChange
	for _, region := range regions {
		r, ok := have[region]
		switch {
		case !ok:
			out = append(out, RegionChange{region, "create"})
		case r.Deleted:
			out = append(out, RegionChange{region, "undelete"})
		case !bytes.Equal(r.Spec, spec):
			out = append(out, RegionChange{region, "update"})
		default:
			out = append(out, RegionChange{region, "unchanged"})
		}
	}
	for _, r := range rows {
		if !r.Deleted && !slices.Contains(regions, r.Region) {
			out = append(out, RegionChange{r.Region, "delete"})
		}
	}
	return out
}

// planDelete says what deleting the object from regions (all when empty)
// does to rows.
func planDelete(rows []ObjectRegion, regions []string) []RegionChange {
	var out []RegionChange
	for _, r := range rows {
		if len(regions) > 0 && !slices.Contains(regions, r.Region) {
			continue
		}
		what := "delete"
		if r.Deleted {
			what = "unchanged"
		}
		out = append(out, RegionChange{r.Region, what})
	}
	return out
}

// PlanPut says, without writing, what PutObject would do.
func (s *Store) PlanPut(ctx context.Context, kind, id string, spec []byte, regions []string) ([]RegionChange, error) {
	_, spec, rows, err := preparePut(ctx, s.db, kind, id, spec, regions, false)
	if err != nil {
		return nil, err
	}
	return planPut(rows, spec, regions), nil
}

// PutObject makes object (kind, id) desired with spec in exactly regions:
// rows in those regions are written where their content changes (new,
// changed, or deleted before), rows in other regions are soft-deleted.
// Every row written is touched, so it gets a new version when the
// transaction commits; an unchanged row keeps its version, so putting the
// same object again changes nothing.
func (t *Tx) PutObject(ctx context.Context, kind, id string, spec []byte, regions []string) ([]RegionChange, error) {
	tab, spec, rows, err := preparePut(ctx, t.tx, kind, id, spec, regions, true)
	if err != nil {
		return nil, err
	}
	plan := planPut(rows, spec, regions)
	specOf := map[string][]byte{}
	for _, r := range rows {
		specOf[r.Region] = r.Spec
	}
	for _, c := range plan {
		switch c.What {
		case "unchanged":
		case "delete":
			err = tab.write(ctx, t, kind, id, c.Region, specOf[c.Region], true)
		default:
			err = tab.write(ctx, t, kind, id, c.Region, spec, false)
		}
		if err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// preparePut checks a put, canonicalises its spec and reads the object's
// rows (locked, inside a write).
func preparePut(ctx context.Context, q querier, kind, id string, spec []byte, regions []string, lock bool) (*objectTable, []byte, []ObjectRegion, error) {
	tab, spec, err := checkPut(kind, id, spec, regions)
	if err != nil {
		return nil, nil, nil, err
	}
	rows, err := tab.rows(ctx, q, kind, id, lock)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkRegions(tab, kind, id, rows, regions); err != nil {
		return nil, nil, nil, err
	}
	return tab, spec, rows, nil
}

// DeleteObject soft-deletes object (kind, id) in regions (every region
// when empty): each live row becomes deleted with a new version. Deleting
// an object already deleted changes nothing; one that never existed is
// ErrNotFound.
func (t *Tx) DeleteObject(ctx context.Context, kind, id string, regions []string) ([]RegionChange, error) {
	tab, err := objectTableOf(kind)
	if err != nil {
		return nil, err
	}
	rows, err := tab.rows(ctx, t.tx, kind, id, true)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("store: %s %s: %w", kind, id, ErrNotFound)
	}
	plan := planDelete(rows, regions)
	for _, c := range plan {
		if c.What != "delete" {
			continue
		}
		i := slices.IndexFunc(rows, func(r ObjectRegion) bool { return r.Region == c.Region })
		if err := tab.write(ctx, t, kind, id, c.Region, rows[i].Spec, true); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

func checkPut(kind, id string, spec []byte, regions []string) (*objectTable, []byte, error) {
	tab, err := objectTableOf(kind)
	if err != nil {
		return nil, nil, err
	}
	if id == "" {
		return nil, nil, refused("%s object needs an id", kind)
	}
	if len(regions) == 0 {
		return nil, nil, refused("%s %s needs at least one region", kind, id)
	}
	canon, err := CanonicalJSON(spec)
	if err != nil || !bytes.HasPrefix(canon, []byte("{")) {
		return nil, nil, refused("%s %s: the spec must be a JSON object", kind, id)
	}
	return tab, canon, nil
}

// checkRegions enforces the one-region rule of tables keyed by id alone.
func checkRegions(tab *objectTable, kind, id string, rows []ObjectRegion, regions []string) error {
	if !tab.oneRegion {
		return nil
	}
	if len(regions) != 1 {
		return refused("a %s lives in exactly one region (%s names %d): give one region, or one object per region with distinct ids", kind, id, len(regions))
	}
	for _, r := range rows {
		if r.Region != regions[0] {
			return refused("%s %s is in region %s; it cannot move to %s (delete it and create one with a new id)", kind, id, r.Region, regions[0])
		}
	}
	return nil
}

// GetObject reads an object's rows, statuses and apply errors;
// ErrNotFound when it has no row.
func (s *Store) GetObject(ctx context.Context, kind, id string) (Object, error) {
	tab, err := objectTableOf(kind)
	if err != nil {
		return Object{}, err
	}
	rows, err := tab.rows(ctx, s.db, kind, id, false)
	if err != nil {
		return Object{}, err
	}
	if len(rows) == 0 {
		return Object{}, fmt.Errorf("store: %s %s: %w", kind, id, ErrNotFound)
	}
	o := Object{Kind: kind, ID: id, Regions: rows}
	errs, err := s.applyErrorsOf(ctx, kind, []string{id})
	if err != nil {
		return Object{}, err
	}
	attachErrors([]*Object{&o}, errs)
	if err := s.attachActual(ctx, []*Object{&o}); err != nil {
		return Object{}, err
	}
	return o, nil
}

// attachActual rolls up each region of objs by the aggregation rule.
func (s *Store) attachActual(ctx context.Context, objs []*Object) error {
	var ds []desiredObj
	errs := map[objKey][]ApplyError{}
	for _, o := range objs {
		for _, r := range o.Regions {
			k := objKey{o.Kind, r.Region, o.ID}
			ds = append(ds, desiredObj{objKey: k, version: r.Version, deleted: r.Deleted})
			errs[k] = r.Errors
		}
	}
	rolled, err := s.rollUp(ctx, ds, errs)
	if err != nil {
		return err
	}
	for _, o := range objs {
		for i := range o.Regions {
			r := &o.Regions[i]
			r.Actual = rolled[objKey{o.Kind, r.Region, o.ID}]
			r.ObservedVersion = r.Actual.Lowest
			if _, rep, reported, ok := r.Actual.Behind(); ok && reported {
				r.ObservedAt, r.Status = rep.At, rep.Status
			}
		}
	}
	return nil
}

func attachErrors(objs []*Object, errs []ApplyError) {
	for _, e := range errs {
		for _, o := range objs {
			if o.ID != e.ID {
				continue
			}
			for i := range o.Regions {
				if o.Regions[i].Region == e.Region {
					o.Regions[i].Errors = append(o.Regions[i].Errors, e)
				}
			}
		}
	}
}

// ObjectFilter selects the objects ListObjects returns.
type ObjectFilter struct {
	Kind string
	// Region keeps objects with a row in that region (and shows only it).
	Region string
	// IncludeDeleted keeps objects deleted in every region.
	IncludeDeleted bool
}

// ListObjects returns up to limit objects of a kind with ids after
// `after`, in id order.
func (s *Store) ListObjects(ctx context.Context, f ObjectFilter, after string, limit int) ([]Object, error) {
	tab, err := objectTableOf(f.Kind)
	if err != nil {
		return nil, err
	}
	table, kindCond, args := "resources", "kind = ? AND ", []any{f.Kind}
	if tab == ciliumObjects {
		table, kindCond, args = "cilium_network_policies", "", nil
	}
	q := "SELECT id FROM " + table + " WHERE " + kindCond + "id > ?"
	args = append(args, after)
	if f.Region != "" {
		q += " AND region = ?"
		args = append(args, f.Region)
	}
	q += " GROUP BY id"
	if !f.IncludeDeleted {
		q += " HAVING SUM(NOT deleted) > 0"
	}
	q += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list %s objects: %w", f.Kind, err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]Object, 0, len(ids))
	ptrs := make([]*Object, 0, len(ids))
	for _, id := range ids {
		regions, err := tab.rows(ctx, s.db, f.Kind, id, false)
		if err != nil {
			return nil, err
		}
		if f.Region != "" {
			regions = slices.DeleteFunc(regions, func(r ObjectRegion) bool { return r.Region != f.Region })
		}
		out = append(out, Object{Kind: f.Kind, ID: id, Regions: regions})
	}
	for i := range out {
		ptrs = append(ptrs, &out[i])
	}
	if len(ids) > 0 {
		errs, err := s.applyErrorsOf(ctx, f.Kind, ids)
		if err != nil {
			return nil, err
		}
		attachErrors(ptrs, errs)
		if err := s.attachActual(ctx, ptrs); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// applyErrorsOf lists the apply errors of many objects of one kind.
func (s *Store) applyErrorsOf(ctx context.Context, kind string, ids []string) ([]ApplyError, error) {
	args := []any{kind}
	for _, id := range ids {
		args = append(args, id)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT kind, region, id, cluster_id, version, message, field, permanent, updated_at
FROM apply_errors WHERE kind = ? AND id IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`) ORDER BY id, region, cluster_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read apply errors of %d %s objects: %w", len(ids), kind, err)
	}
	return scanApplyErrors(rows)
}
