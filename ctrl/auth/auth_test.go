package auth_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// operatorAPI is a stand-in operator service: it answers with the caller's
// name, proving the call got through.
type operatorAPI struct {
	ctrlv1.UnimplementedDeploymentServiceServer
}

func (operatorAPI) GetDeployment(ctx context.Context, req *ctrlv1.GetDeploymentRequest) (*ctrlv1.DeploymentInfo, error) {
	id, _ := auth.FromContext(ctx)
	return &ctrlv1.DeploymentInfo{Id: req.GetDeploymentId(), Image: "seen-by:" + id.Name}, nil
}

func TestParseRoundTripAndRejects(t *testing.T) {
	p, err := auth.Parse("krane_c_abcdefghijkl_" + strings.Repeat("A_-b", 10) + "xyz")
	if err != nil || p.Kind != store.ClusterToken || p.ID != "abcdefghijkl" || !strings.HasPrefix(p.Secret, "A_-b") {
		t.Fatalf("Parse = %+v, %v", p, err)
	}
	for _, bad := range []string{"", "krane_", "krane_x_abcdefghijkl_" + strings.Repeat("a", 43), "krane_c_short_" + strings.Repeat("a", 43),
		"krane_c_abcdefghijkl_" + strings.Repeat("a", 42), "other_c_abcdefghijkl_" + strings.Repeat("a", 43), "krane_c_ABCDEFGHIJKL_" + strings.Repeat("a", 43)} {
		if _, err := auth.Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		} else if len(bad) > 20 && strings.Contains(err.Error(), bad) {
			t.Errorf("Parse error echoes the token: %v", err)
		}
	}
}

func code(err error) codes.Code { return status.Code(err) }

// secretOf is the secret part of a token: its last 43 characters.
func secretOf(token string) string { return token[len(token)-43:] }

// firstRecvErr opens a server stream and returns the error of its first
// message (where gRPC reports a refused stream).
func watchErr(cli clusterv1.ClusterServiceClient, req *clusterv1.WatchRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cli.Watch(ctx, req)
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

func TestEveryCallIsAuthenticatedAndScoped(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{
		Configure: func(c *serve.Config) {
			c.Watch.KeepAlive = 200 * time.Millisecond
		},
		Deps: serve.Deps{RegisterServices: func(gs *grpc.Server, _ *store.Store) error {
			ctrlv1.RegisterDeploymentServiceServer(gs, operatorAPI{})
			return nil
		}},
	})
	ctx := context.Background()
	euToken := env.ClusterToken(t, "eu", "eu-1")
	usToken := env.ClusterToken(t, "us", "us-1")
	opToken := env.OperatorToken(t, "release-bot")
	p, _ := auth.Parse(euToken)
	wrongSecret := strings.TrimSuffix(euToken, p.Secret) + strings.Repeat("x", len(p.Secret))
	unknownID := "krane_c_aaaaaaaaaaaa_" + p.Secret
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: "x.example", Region: "us", ID: "secret-thing", Spec: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	get := &clusterv1.GetDesiredStateRequest{Kind: "x.example", Id: "secret-thing"}

	cases := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"no token, unary", func() error { _, err := env.Cluster(t, "").GetDesiredState(ctx, get); return err }, codes.Unauthenticated},
		{"no token, stream", func() error { return watchErr(env.Cluster(t, ""), &clusterv1.WatchRequest{Kind: kinds.Deployment}) }, codes.Unauthenticated},
		{"malformed token", func() error { _, err := env.Cluster(t, "not-a-token").GetDesiredState(ctx, get); return err }, codes.Unauthenticated},
		{"wrong secret", func() error { _, err := env.Cluster(t, wrongSecret).GetDesiredState(ctx, get); return err }, codes.Unauthenticated},
		{"unknown token id", func() error { _, err := env.Cluster(t, unknownID).GetDesiredState(ctx, get); return err }, codes.Unauthenticated},
		{"region-A token reads region B (Watch)", func() error {
			return watchErr(env.Cluster(t, euToken), &clusterv1.WatchRequest{Kind: "x.example", Region: "us"})
		}, codes.PermissionDenied},
		{"region-A token reads region B (ListDesired)", func() error {
			s, err := env.Cluster(t, euToken).ListDesired(ctx, &clusterv1.ListDesiredRequest{Kind: "x.example", Region: "us"})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.PermissionDenied},
		{"region-A token reads region B (typed watch)", func() error {
			s, err := env.Cluster(t, euToken).WatchDeployments(ctx, &clusterv1.WatchDeploymentsRequest{Region: "us"})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.PermissionDenied},
		{"region-A token gets a region-B object", func() error { _, err := env.Cluster(t, euToken).GetDesiredState(ctx, get); return err }, codes.NotFound},
		{"region metadata differs from the token", func() error {
			_, err := env.Cluster(t, euToken, auth.RegionHeader, "us").GetDesiredState(ctx, get)
			return err
		}, codes.PermissionDenied},
		{"cluster-id metadata differs from the token", func() error {
			_, err := env.Cluster(t, euToken, auth.ClusterIDHeader, "us-1").GetDesiredState(ctx, get)
			return err
		}, codes.PermissionDenied},
		{"cluster token on the operator API", func() error {
			_, err := ctrlv1.NewDeploymentServiceClient(env.Dial(t, euToken)).GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: "d1"})
			return err
		}, codes.PermissionDenied},
		{"operator token on the ClusterService", func() error { _, err := env.Cluster(t, opToken).GetDesiredState(ctx, get); return err }, codes.PermissionDenied},
		{"operator token on a ClusterService stream", func() error {
			return watchErr(env.Cluster(t, opToken), &clusterv1.WatchRequest{Kind: kinds.Deployment})
		}, codes.PermissionDenied},
		{"own region with matching metadata", func() error {
			_, err := env.Cluster(t, usToken, auth.RegionHeader, "us", auth.ClusterIDHeader, "us-1").GetDesiredState(ctx, get)
			return err
		}, codes.OK},
	}
	for _, c := range cases {
		err := c.call()
		if code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
		for _, tok := range []string{euToken, usToken, opToken} {
			if err != nil && strings.Contains(err.Error(), secretOf(tok)) {
				t.Errorf("%s: the error echoes a token secret: %v", c.name, err)
			}
		}
	}
	// The operator token does reach the operator API.
	info, err := ctrlv1.NewDeploymentServiceClient(env.Dial(t, opToken)).GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: "d1"})
	if err != nil || info.GetImage() != "seen-by:release-bot" {
		t.Fatalf("operator call = %v, %v; want it answered for release-bot", info, err)
	}

	// Revocation: an open stream ends, and new calls are refused, within
	// the revocation poll interval.
	cli := env.Cluster(t, usToken)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a stream that never ends fails, not hangs
	defer cancel()
	stream, err := cli.Watch(sctx, &clusterv1.WatchRequest{Kind: "x.example"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetChange().GetId() != "secret-thing" {
		t.Fatalf("stream before revocation: %v, %v", ev, err)
	}
	if n, err := env.Store.RevokeClusterTokens(ctx, "us-1"); err != nil || n != 1 {
		t.Fatalf("revoke: %d, %v", n, err)
	}
	revoked := time.Now()
	for {
		_, err := stream.Recv()
		if err == nil {
			continue // keep-alives
		}
		if code(err) != codes.Unauthenticated {
			t.Fatalf("open stream after revocation ended with %v, want Unauthenticated", err)
		}
		break
	}
	t.Logf("open stream closed %s after its token was revoked", time.Since(revoked).Round(time.Millisecond))
	if time.Since(revoked) > time.Second {
		t.Errorf("revocation took %s to end the stream, want well under a second", time.Since(revoked))
	}
	if _, err := cli.GetDesiredState(ctx, get); code(err) != codes.Unauthenticated {
		t.Errorf("revoked token: %v, want Unauthenticated", err)
	}

	// Nothing secret in the server's logs.
	logs := env.Logs.String()
	if !strings.Contains(logs, "call refused") {
		t.Fatalf("the refusals were not logged at all:\n%s", logs)
	}
	for _, tok := range []string{euToken, usToken, opToken, wrongSecret, unknownID} {
		if strings.Contains(logs, tok) || strings.Contains(logs, secretOf(tok)) {
			t.Errorf("server logs contain a token or its secret:\n%s", logs)
		}
	}
}
