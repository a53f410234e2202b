package store

import (
	"database/sql"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/deploytrace"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// Ref names one desired-state row: a kind, a region and the object's id.
type Ref struct {
	Kind   string
	Region string
	ID     string
}

func (r Ref) String() string { return r.Kind + " " + r.Region + "/" + r.ID }

// Change is one desired-state row as agents see it.
type Change struct {
	Kind    string
	Region  string
	ID      string
	Version uint64
	// Deleted: the object must not exist in the cluster (soft delete).
	Deleted bool
	// Spec is the kind's payload: *clusterv1.Deployment, *clusterv1.Sentinel,
	// *clusterv1.CiliumNetworkPolicy, or *structpb.Struct for generic kinds.
	// It is set for deleted rows too (typed deletes need the names); the
	// generic wire form leaves it out when Deleted.
	Spec proto.Message
	// Err is set when the row could not be converted (corrupt JSON in a
	// column, say); Spec is then nil. Version is still valid, so a stream can
	// move past the row.
	Err error
	// TraceParent is the W3C trace context the change travels with: the
	// deploy's (see ctrl/deploytrace) while a deployment's deploy is in
	// progress, empty otherwise.
	TraceParent string
}

// kindPattern is what a kind name may look like: lowercase DNS-like words.
var kindPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,126}[a-z0-9])?$`)

// ValidKind reports whether name is an acceptable kind name.
func ValidKind(name string) bool { return kindPattern.MatchString(name) }

// kindDef is how one kind maps onto SQL. The built-in kinds have their own
// tables; every other kind lives in the generic resources table.
type kindDef struct {
	// table holds the kind's rows, keyCols name a row in it (keyArgs gives
	// their values for a ref), and its version column is "version".
	table   string
	keyCols []string
	keyArgs func(Ref) []any

	// selectFrom is "SELECT <columns> FROM <tables>"; the conditions below
	// are ANDed onto it.
	selectFrom string
	// regionCond selects the region (and kind); regionArgs gives its args.
	regionCond string
	regionArgs func(kind, region string) []any
	versionCol string
	// liveCond is true for rows that are not soft-deleted.
	liveCond string
	// idCond selects one object by id (after regionCond).
	idCond string
	// scan reads one row of selectFrom.
	scan func(s scanner, kind string) (Change, error)
}

type scanner interface{ Scan(dest ...any) error }

// rowVersionSQL reads one row's version by its key (keyArgs), locking the
// row (FOR UPDATE) when lock is set.
func (d *kindDef) rowVersionSQL(lock bool) string {
	q := "SELECT version FROM " + d.table + " WHERE " + strings.Join(d.keyCols, " = ? AND ") + " = ?"
	if lock {
		q += " FOR UPDATE"
	}
	return q
}

var builtinKinds = map[string]*kindDef{
	kinds.Deployment: {
		table:   "deployment_topology",
		keyCols: []string{"deployment_id", "region"},
		keyArgs: func(r Ref) []any { return []any{r.ID, r.Region} },
		selectFrom: `SELECT dt.deployment_id, dt.region, dt.version, dt.desired_replicas, dt.desired_status,
  d.workspace_id, d.project_id, d.environment_id, d.app_id, d.k8s_namespace, d.k8s_name, d.workload, d.encrypted_env, d.status
FROM deployment_topology dt JOIN deployments d ON d.id = dt.deployment_id`,
		regionCond: "dt.region = ?",
		regionArgs: func(_, region string) []any { return []any{region} },
		versionCol: "dt.version",
		liveCond:   "dt.desired_status = 'running' AND dt.desired_replicas > 0",
		idCond:     "dt.deployment_id = ?",
		scan:       scanDeployment,
	},
	kinds.Sentinel: {
		table:   "sentinels",
		keyCols: []string{"id", "region"},
		keyArgs: func(r Ref) []any { return []any{r.ID, r.Region} },
		selectFrom: `SELECT id, region, version, workspace_id, project_id, app_id, environment_id, k8s_name,
  image, replicas, cpu_millicores, memory_mib, desired_state, encrypted_credentials, routes
FROM sentinels`,
		regionCond: "region = ?",
		regionArgs: func(_, region string) []any { return []any{region} },
		versionCol: "version",
		liveCond:   "desired_state = 'running'",
		idCond:     "id = ?",
		scan:       scanSentinel,
	},
	kinds.CiliumNetworkPolicy: {
		table:      "cilium_network_policies",
		keyCols:    []string{"id", "region"},
		keyArgs:    func(r Ref) []any { return []any{r.ID, r.Region} },
		selectFrom: `SELECT id, region, version, k8s_namespace, k8s_name, policy, deleted FROM cilium_network_policies`,
		regionCond: "region = ?",
		regionArgs: func(_, region string) []any { return []any{region} },
		versionCol: "version",
		liveCond:   "NOT deleted",
		idCond:     "id = ?",
		scan:       scanCiliumNetworkPolicy,
	},
}

var genericKind = &kindDef{
	table:      "resources",
	keyCols:    []string{"kind", "region", "id"},
	keyArgs:    func(r Ref) []any { return []any{r.Kind, r.Region, r.ID} },
	selectFrom: `SELECT kind, region, id, version, spec, deleted FROM resources`,
	regionCond: "region = ? AND kind = ?",
	regionArgs: func(kind, region string) []any { return []any{region, kind} },
	versionCol: "version",
	liveCond:   "NOT deleted",
	idCond:     "id = ?",
	scan:       scanResource,
}

// lookupKind returns the SQL mapping of kind.
func lookupKind(kind string) *kindDef {
	if d, ok := builtinKinds[kind]; ok {
		return d
	}
	return genericKind
}

// IsBuiltIn reports whether kind has its own table (and typed payload).
func IsBuiltIn(kind string) bool {
	_, ok := builtinKinds[kind]
	return ok
}

func scanDeployment(s scanner, kind string) (Change, error) {
	c := Change{Kind: kind}
	d := &clusterv1.Deployment{}
	var desiredStatus, status string
	var workload []byte
	if err := s.Scan(&c.ID, &c.Region, &c.Version, &d.Replicas, &desiredStatus,
		&d.WorkspaceId, &d.ProjectId, &d.EnvironmentId, &d.AppId, &d.K8SNamespace, &d.K8SName, &workload, &d.EncryptedEnv, &status); err != nil {
		return c, err
	}
	d.Id = c.ID
	if status == StatusDeploying || status == StatusNetwork {
		// The deploy is in progress: the clusters' applies join its trace.
		c.TraceParent = deploytrace.TraceParent(c.ID)
	}
	c.Deleted = desiredStatus != "running" || d.Replicas <= 0
	w, err := decodeWorkload(c.ID, workload)
	if err != nil {
		c.Err = err
		return c, nil
	}
	d.Workload = w
	c.Spec = withLegacyFields(d)
	return c, nil
}

func scanSentinel(s scanner, kind string) (Change, error) {
	c := Change{Kind: kind}
	var sn clusterv1.Sentinel
	var desiredState string
	var routes sql.NullString
	if err := s.Scan(&c.ID, &c.Region, &c.Version, &sn.WorkspaceId, &sn.ProjectId, &sn.AppId, &sn.EnvironmentId,
		&sn.K8SName, &sn.Image, &sn.Replicas, &sn.CpuMillicores, &sn.MemoryMib, &desiredState, &sn.EncryptedCredentials, &routes); err != nil {
		return c, err
	}
	sn.Id = c.ID
	r, err := decodeRoutes(c.ID, routes)
	if err != nil {
		return c, err
	}
	sn.Routes = r
	c.Deleted = desiredState != "running"
	c.Spec = &sn
	return c, nil
}

func scanCiliumNetworkPolicy(s scanner, kind string) (Change, error) {
	c := Change{Kind: kind}
	var p clusterv1.CiliumNetworkPolicy
	if err := s.Scan(&c.ID, &c.Region, &c.Version, &p.K8SNamespace, &p.K8SName, &p.Policy, &c.Deleted); err != nil {
		return c, err
	}
	p.Id = c.ID
	c.Spec = &p
	return c, nil
}

func scanResource(s scanner, _ string) (Change, error) {
	var c Change
	var spec []byte
	if err := s.Scan(&c.Kind, &c.Region, &c.ID, &c.Version, &spec, &c.Deleted); err != nil {
		return c, err
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(spec, st); err != nil {
		c.Err = fmt.Errorf("resources.spec of %s %s is not a JSON object: %w", c.Kind, c.ID, err)
		return c, nil
	}
	c.Spec = st
	return c, nil
}

// nullString maps "" to NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
