package clusterapi_test

//lint:file-ignore SA1019 typed-rpcs: removed no earlier than v0.4.0 (docs/compatibility.md); this file calls a deprecated typed ClusterService RPC

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// reportTables is every table a report may write, as text: what must not
// change when a report is refused.
func reportTables(t *testing.T, s *store.Store) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		"SELECT deployment_id, region, cluster_id, k8s_name, address, cpu_millicores, memory_mib, status, reason, COALESCE(message, ''), zone, observed_version, observed_at_ns FROM instances ORDER BY 1, 2, 3, 4",
		"SELECT kind, region, id, cluster_id, observed_version, observed_at_ns, deleted, COALESCE(status, ''), status_sum FROM object_reports ORDER BY 1, 2, 3, 4",
		"SELECT kind, region, id, cluster_id, version, message, field, permanent FROM apply_errors ORDER BY 1, 2, 3, 4",
	} {
		rows, err := s.DB().Query(q)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&b, "%v|", v)
			}
			b.WriteString("\n")
		}
		rows.Close()
	}
	return b.String()
}

// TestBadReportsAreRefusedNamingTheField sends every kind of report a
// misbehaving cluster could send: negative counts, CPU, memory and
// generations, enum values that do not exist, versions ctrl never issued,
// a time far in the future, oversized strings. Each is refused with
// InvalidArgument naming the field, changes no row, and does not keep the
// good report sent beside it in the same batch from landing.
func TestBadReportsAreRefusedNamingTheField(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	dv := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	sv := env.Store
	stamped, err := sv.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "eu", EnvironmentID: "env", K8sName: "sen", Image: "sentinel:1", Replicas: 2}); err != nil {
			return err
		}
		if err := tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: "p1", Region: "eu", K8sNamespace: "ns", K8sName: "allow", Policy: []byte(`{}`)}); err != nil {
			return err
		}
		return tx.PutResource(ctx, store.Resource{Kind: genericKind, Region: "eu", ID: "r1", Spec: []byte(`{"data":{}}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	version := map[string]uint64{"d1": dv}
	for _, s := range stamped {
		version[s.ID] = s.Version
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	now := time.Now()

	dep := func(mod func(*clusterv1.DeploymentStatus)) *clusterv1.ReportStatusRequest {
		st := &clusterv1.DeploymentStatus{DeploymentId: "d1", DesiredReplicas: 2, ReadyReplicas: 1, AvailableReplicas: 1,
			Instances: []*clusterv1.Instance{{K8SName: "d1-a", Address: "10.0.0.1:8080", CpuMillicores: 250, MemoryMib: 256, Status: clusterv1.Instance_STATUS_RUNNING, Zone: "a"}}}
		if mod != nil {
			mod(st)
		}
		return &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", ObservedVersion: dv, ObservedAt: timestamppb.New(now), Status: mustAny(st)}
	}
	sen := func(mod func(*clusterv1.SentinelStatus)) *clusterv1.ReportStatusRequest {
		st := &clusterv1.SentinelStatus{SentinelId: "s1", DesiredReplicas: 2, AvailableReplicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2,
			ObservedGeneration: 3, RunningImage: "sentinel:1", Health: clusterv1.Health_HEALTH_HEALTHY}
		if mod != nil {
			mod(st)
		}
		return &clusterv1.ReportStatusRequest{Kind: kinds.Sentinel, Id: "s1", ObservedVersion: version["s1"], ObservedAt: timestamppb.New(now), Status: mustAny(st)}
	}
	pol := func(msg string) *clusterv1.ReportStatusRequest {
		return &clusterv1.ReportStatusRequest{Kind: kinds.CiliumNetworkPolicy, Id: "p1", ObservedVersion: version["p1"], ObservedAt: timestamppb.New(now),
			Status: mustAny(&clusterv1.CiliumNetworkPolicyStatus{Id: "p1", Applied: msg == "", Message: msg})}
	}
	gen := func(doc map[string]any) *clusterv1.ReportStatusRequest {
		s, err := structpb.NewStruct(doc)
		if err != nil {
			t.Fatal(err)
		}
		return &clusterv1.ReportStatusRequest{Kind: genericKind, Id: "r1", ObservedVersion: version["r1"], ObservedAt: timestamppb.New(now), Status: mustAny(s)}
	}
	withVersion := func(r *clusterv1.ReportStatusRequest, v uint64) *clusterv1.ReportStatusRequest {
		r.ObservedVersion = v
		return r
	}
	applyErr := func(ae *clusterv1.ApplyError) *clusterv1.ReportStatusRequest {
		return &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", ObservedVersion: dv, ObservedAt: timestamppb.New(now), ApplyError: ae}
	}
	huge := strings.Repeat("x", 8<<20)

	// Good reports first: what the bad ones must not replace.
	for _, r := range []*clusterv1.ReportStatusRequest{dep(nil), sen(nil), pol(""), gen(map[string]any{"phase": "Applied"})} {
		if resp, err := cli.ReportStatus(ctx, r); err != nil || !resp.GetAccepted() {
			t.Fatalf("good report on %s %s: %v, %v", r.GetKind(), r.GetId(), resp, err)
		}
	}
	before := reportTables(t, env.Store)

	for _, c := range []struct {
		field string
		req   *clusterv1.ReportStatusRequest
	}{
		{"status.desired_replicas", dep(func(s *clusterv1.DeploymentStatus) { s.DesiredReplicas = -1 })},
		{"status.ready_replicas", dep(func(s *clusterv1.DeploymentStatus) { s.ReadyReplicas = -2 })},
		{"status.available_replicas", dep(func(s *clusterv1.DeploymentStatus) { s.AvailableReplicas = -3 })},
		{"status.instances[0].cpu_millicores", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].CpuMillicores = -250 })},
		{"status.instances[0].memory_mib", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].MemoryMib = -1 })},
		{"status.instances[0].status", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].Status = 42 })},
		{"status.instances[0].k8s_name", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].K8SName = huge })},
		{"status.instances[0].address", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].Address = strings.Repeat("a", 300) })},
		{"status.instances[0].reason", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].Reason = strings.Repeat("r", 300) })},
		{"status.instances[0].message", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].Message = huge })},
		{"status.instances[0].zone", dep(func(s *clusterv1.DeploymentStatus) { s.Instances[0].Zone = strings.Repeat("z", 65) })},
		{"status.k8s_name", dep(func(s *clusterv1.DeploymentStatus) { s.K8SName = strings.Repeat("k", 254) })},
		{"status.available_replicas", sen(func(s *clusterv1.SentinelStatus) { s.AvailableReplicas = -3 })},
		{"status.observed_generation", sen(func(s *clusterv1.SentinelStatus) { s.ObservedGeneration = -1 })},
		{"status.updated_replicas", sen(func(s *clusterv1.SentinelStatus) { s.UpdatedReplicas = -1 })},
		{"status.health", sen(func(s *clusterv1.SentinelStatus) { s.Health = 7 })},
		{"status.reason", sen(func(s *clusterv1.SentinelStatus) { s.Reason = huge })},
		{"status.running_image", sen(func(s *clusterv1.SentinelStatus) { s.RunningImage = strings.Repeat("i", 600) })},
		{"status.message", pol(huge)},
		{"status", gen(map[string]any{"blob": huge})},
		{"observed_version", withVersion(dep(nil), math.MaxUint64)},
		{"observed_version", withVersion(sen(nil), version["s1"]+1)},
		{"observed_version", withVersion(pol(""), math.MaxUint64)},
		{"observed_version", withVersion(gen(map[string]any{"phase": "Future"}), math.MaxUint64)},
		{"observed_at", func() *clusterv1.ReportStatusRequest {
			r := sen(nil)
			r.ObservedAt = timestamppb.New(now.Add(365 * 24 * time.Hour))
			return r
		}()},
		{"apply_error.version", applyErr(&clusterv1.ApplyError{Version: math.MaxUint64, Message: "cannot apply", Permanent: true})},
		{"apply_error.message", applyErr(&clusterv1.ApplyError{Version: dv, Message: huge, Permanent: true})},
		{"apply_error.field", applyErr(&clusterv1.ApplyError{Version: dv, Message: "bad", Field: strings.Repeat("f", 300), Permanent: true})},
		{"id", &clusterv1.ReportStatusRequest{Kind: genericKind, Id: strings.Repeat("i", 254), ObservedVersion: 1, Status: mustAny(&structpb.Struct{})}},
	} {
		t.Run(c.field, func(t *testing.T) {
			// The bad report beside a good one, in one batch.
			good := sen(func(s *clusterv1.SentinelStatus) { s.ObservedGeneration = 4 })
			resp, err := cli.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{Reports: []*clusterv1.ReportStatusRequest{c.req, good}})
			if err != nil {
				t.Fatalf("ReportStatuses: %v (the call must succeed; only the bad report is refused)", err)
			}
			bad, ok := resp.GetResults()[0], resp.GetResults()[1]
			if codes.Code(bad.GetCode()) != codes.InvalidArgument || bad.GetAccepted() || !strings.HasPrefix(bad.GetMessage(), c.field+": ") {
				t.Errorf("bad report: %v/%s %.200q, want InvalidArgument starting %q", bad.GetAccepted(), codes.Code(bad.GetCode()), bad.GetMessage(), c.field+": ")
			}
			if ok.GetCode() != 0 {
				t.Errorf("the good report beside it: %s %q, want it stored", codes.Code(ok.GetCode()), ok.GetMessage())
			}
			// ReportStatus answers it the same way.
			if _, err := cli.ReportStatus(ctx, c.req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("ReportStatus: %.200v, want InvalidArgument", err)
			}
			// Nothing of it is stored: put the good sentinel row back the
			// way it was and compare everything.
			if resp, err := cli.ReportStatus(ctx, sen(nil)); err != nil || !resp.GetAccepted() {
				t.Fatalf("restoring the sentinel's report: %v, %v", resp, err)
			}
			if after := reportTables(t, env.Store); after != before {
				t.Errorf("rows changed by a refused report:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	// The typed forms check the same fields.
	_, err = cli.ReportSentinelStatus(ctx, &clusterv1.ReportSentinelStatusRequest{ObservedVersion: version["s1"], ObservedAt: timestamppb.New(now),
		Status: &clusterv1.SentinelStatus{SentinelId: "s1", AvailableReplicas: -3, ObservedGeneration: -1, Health: clusterv1.Health_HEALTH_HEALTHY}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "status.available_replicas") {
		t.Errorf("ReportSentinelStatus with negative counts: %v, want InvalidArgument naming status.available_replicas", err)
	}
	_, err = cli.ReportDeploymentStatus(ctx, &clusterv1.ReportDeploymentStatusRequest{ObservedVersion: math.MaxUint64, ObservedAt: timestamppb.New(now),
		Status: &clusterv1.DeploymentStatus{DeploymentId: "d1"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "observed_version") {
		t.Errorf("ReportDeploymentStatus at a version ctrl never issued: %v, want InvalidArgument naming observed_version", err)
	}
	if after := reportTables(t, env.Store); after != before {
		t.Errorf("rows changed by the typed forms' refused reports:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The real reports of the object still land after all that.
	if resp, err := cli.ReportStatus(ctx, dep(func(s *clusterv1.DeploymentStatus) { s.ReadyReplicas = 2 })); err != nil || !resp.GetAccepted() {
		t.Fatalf("a real report after the bad ones: %v, %v; want accepted", resp, err)
	}
}
