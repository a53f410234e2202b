package clusterapi_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// skewClient is a ClusterService client that says it is krane of version v
// (its user agent, as krane's ctrl client does).
func skewClient(t *testing.T, env *ctrltest.Env, token, v string) clusterv1.ClusterServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(env.Server.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent("krane/"+v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clusterv1.NewClusterServiceClient(conn)
}

// TestHostOlderThanTheSkewWindowIsToldWhy: a ctrl of v0.3.0 serves krane
// v0.2.x and v0.3.x. A v0.1.x host is refused on every call, streams
// included, with FAILED_PRECONDITION saying which versions ctrl serves and
// what to do, even when its request breaks a bound it never knew (the
// bound's INVALID_ARGUMENT would tell it nothing); what it runs is still
// recorded for the fleet views. Hosts in the window, newer hosts and
// clients that name no version are served.
func TestHostOlderThanTheSkewWindowIsToldWhy(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Deps: serve.Deps{Version: "v0.3.0"}})
	tok := env.ClusterToken(t, "eu", "eu-1")
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)

	old := skewClient(t, env, tok, "v0.1.4")
	tooLong := strings.Repeat("v", 200) // past agent_version's bound
	_, hbErr := old.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: tooLong})
	_, repErr := old.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{})
	watch, err := old.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	_, watchErr := watch.Recv()
	for call, err := range map[string]error{"Heartbeat": hbErr, "ReportStatuses": repErr, "Watch": watchErr} {
		st := status.Convert(err)
		if st.Code() != codes.FailedPrecondition {
			t.Errorf("%s from krane v0.1.4: %s %q, want FAILED_PRECONDITION", call, st.Code(), st.Message())
			continue
		}
		for _, want := range []string{"v0.1.4", "too old", "v0.3.0", "v0.2.x", "upgrade krane to v0.2.0"} {
			if !strings.Contains(st.Message(), want) {
				t.Errorf("%s: the refusal %q does not say %q", call, st.Message(), want)
			}
		}
	}
	list, err := env.Store.ListClusters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].AgentVersion != "v0.1.4" || !list[0].LastHeartbeatAt.IsZero() {
		t.Errorf("the refused host's cluster row: %+v; want its version recorded and no heartbeat counted", list)
	}

	for _, v := range []string{"v0.2.0", "v0.3.1", "v0.4.0-dev.2+abc", "dev"} {
		c := skewClient(t, env, tok, v)
		if _, err := c.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: v}); err != nil {
			t.Errorf("a heartbeat of krane %s: %v, want it served", v, err)
		}
		w, err := c.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, Region: "eu"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil && err != io.EOF {
			t.Errorf("a watch of krane %s: %v, want it served", v, err)
		}
	}
	if !strings.Contains(env.Logs.String(), "refusing a krane host older than the skew window") {
		t.Error("no log line names the refused host")
	}
}
