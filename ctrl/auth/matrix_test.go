package auth_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/cli"
	"krane.dev/ctrl/deployapi"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// The services under test: the agents' ClusterService and every operator
// service. Each RPC of each comes from the generated ServiceDesc, so a new
// RPC is in the matrix without touching this test; a new service in either
// proto package fails TestAuthMatrix until it is listed here.
var (
	clusterServices  = []grpc.ServiceDesc{clusterv1.ClusterService_ServiceDesc}
	operatorServices = []grpc.ServiceDesc{ctrlv1.DeploymentService_ServiceDesc, ctrlv1.SentinelService_ServiceDesc, ctrlv1.RolloutService_ServiceDesc, ctrlv1.FleetService_ServiceDesc, ctrlv1.ResourceService_ServiceDesc}
)

// rpc is one method of a service, with its message types from the proto
// registry.
type rpc struct {
	full    string // /pkg.Service/Method
	cluster bool   // a ClusterService method (needs a cluster token)
	stream  *grpc.StreamDesc
	in, out protoreflect.MessageType
}

func rpcsOf(t *testing.T, cluster bool, descs []grpc.ServiceDesc) []rpc {
	t.Helper()
	var out []rpc
	for _, sd := range descs {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(sd.ServiceName))
		if err != nil {
			t.Fatalf("service %s is not in the proto registry: %v", sd.ServiceName, err)
		}
		svc := d.(protoreflect.ServiceDescriptor)
		types := func(name string) (protoreflect.MessageType, protoreflect.MessageType) {
			m := svc.Methods().ByName(protoreflect.Name(name))
			if m == nil {
				t.Fatalf("%s/%s: no such method in the proto descriptor", sd.ServiceName, name)
			}
			in, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
			if err != nil {
				t.Fatal(err)
			}
			outT, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
			if err != nil {
				t.Fatal(err)
			}
			return in, outT
		}
		for _, m := range sd.Methods {
			in, o := types(m.MethodName)
			out = append(out, rpc{full: "/" + sd.ServiceName + "/" + m.MethodName, cluster: cluster, in: in, out: o})
		}
		for _, s := range sd.Streams {
			in, o := types(s.StreamName)
			desc := &grpc.StreamDesc{StreamName: s.StreamName, ServerStreams: s.ServerStreams, ClientStreams: s.ClientStreams}
			out = append(out, rpc{full: "/" + sd.ServiceName + "/" + s.StreamName, cluster: cluster, stream: desc, in: in, out: o})
		}
		if n := len(sd.Methods) + len(sd.Streams); n != svc.Methods().Len() {
			t.Fatalf("%s: the ServiceDesc has %d methods, the proto %d", sd.ServiceName, n, svc.Methods().Len())
		}
	}
	return out
}

// checkServicesListed fails when a proto package has a service the matrix
// does not cover.
func checkServicesListed(t *testing.T, pkg string, descs []grpc.ServiceDesc) {
	t.Helper()
	listed := map[string]bool{}
	for _, d := range descs {
		listed[d.ServiceName] = true
	}
	protoregistry.GlobalFiles.RangeFilesByPackage(protoreflect.FullName(pkg), func(f protoreflect.FileDescriptor) bool {
		for i := 0; i < f.Services().Len(); i++ {
			if name := string(f.Services().Get(i).FullName()); !listed[name] {
				t.Errorf("service %s (in %s) is not in the authn/z matrix: add its ServiceDesc to matrix_test.go", name, f.Path())
			}
		}
		return true
	})
}

// field sets a string field of m when it has one.
func field(m proto.Message, name, value string) bool {
	f := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name))
	if f == nil || f.Kind() != protoreflect.StringKind || f.IsList() {
		return false
	}
	m.ProtoReflect().Set(f, protoreflect.ValueOfString(value))
	return true
}

// request is r's request: for the ClusterService a valid kind and the given
// region where the message has such fields, otherwise empty.
func (r rpc) request(region string) (proto.Message, bool) {
	m := r.in.New().Interface()
	if !r.cluster {
		return m, false
	}
	field(m, "kind", kinds.Deployment)
	return m, field(m, "region", region)
}

// invoke calls r once with the given metadata and returns the call's error
// (for a server stream: the error of its first receive; a stream that
// closes cleanly is nil).
func invoke(ctx context.Context, conn *grpc.ClientConn, r rpc, md metadata.MD, req proto.Message) error {
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), 15*time.Second)
	defer cancel()
	if r.stream == nil {
		return conn.Invoke(ctx, r.full, req, r.out.New().Interface())
	}
	s, err := conn.NewStream(ctx, r.stream, r.full)
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return err // io.EOF: the server already ended the stream; RecvMsg says how
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	err = s.RecvMsg(r.out.New().Interface())
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func bearer(token string, kv ...string) metadata.MD {
	return metadata.Pairs(append([]string{"authorization", "Bearer " + token}, kv...)...)
}

// deadRestate is where the test's deploy API finds no Restate: calls that
// need it fail with UNAVAILABLE, which is fine for a control cell.
const deadRestate = "http://127.0.0.1:1"

// startWithOperatorAPIs starts ctrl with the real operator services (backed
// by an unreachable Restate), so every RPC of the matrix is served by its
// production handler behind the production interceptors.
func startWithOperatorAPIs(t *testing.T, o ctrltest.Options) *ctrltest.Env {
	o.Deps.RegisterServices = func(gs *grpc.Server, st *store.Store) error {
		dead := restateingress.NewIngressClient(deadRestate, []byte("no key"))
		deployapi.New(deployapi.Options{Store: st, Ingress: dead}).Register(gs)
		deployapi.NewSentinels(deployapi.SentinelOptions{Store: st, Ingress: dead, Waiting: dead}).Register(gs)
		return nil
	}
	return ctrltest.Start(t, o)
}

func TestAuthMatrix(t *testing.T) {
	checkServicesListed(t, "krane.cluster.v1", clusterServices)
	checkServicesListed(t, "krane.ctrl.v1", operatorServices)
	rpcs := append(rpcsOf(t, true, clusterServices), rpcsOf(t, false, operatorServices)...)

	env := startWithOperatorAPIs(t, ctrltest.Options{})
	ctx := context.Background()
	authn := env.Server.Authenticator()

	// Valid, revoked and expired tokens of each kind; the cluster's are all
	// of cluster eu-1 in region eu.
	clusterOK := env.ClusterToken(t, "eu", "eu-1")
	operatorOK := env.OperatorToken(t, "matrix operator")
	clusterRevoked := env.ClusterToken(t, "eu", "eu-1")
	operatorRevoked := env.OperatorToken(t, "revoked operator")
	for _, tok := range []string{clusterRevoked, operatorRevoked} {
		p, _ := auth.Parse(tok)
		if _, err := authn.Revoke(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Tokens revoked long ago: only the database knows (no ctrl saw the
	// revocation happen).
	clusterRevokedOld := env.ClusterToken(t, "eu", "eu-1")
	operatorRevokedOld := env.OperatorToken(t, "operator revoked long ago")
	for _, tok := range []string{clusterRevokedOld, operatorRevokedOld} {
		p, _ := auth.Parse(tok)
		if _, err := env.Store.DB().ExecContext(ctx, "UPDATE api_tokens SET revoked_at = ? WHERE id = ?", time.Now().Add(-2*time.Hour).UnixMilli(), p.ID); err != nil {
			t.Fatal(err)
		}
	}
	clusterExpired, err := auth.RegisterCluster(ctx, env.Store, "eu", "eu-1", auth.ExpiresIn(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	operatorExpired, err := auth.CreateOperatorToken(ctx, env.Store, "expired operator", auth.ExpiresIn(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	p, _ := auth.Parse(clusterOK)
	wrongSecret := strings.TrimSuffix(clusterOK, p.Secret) + strings.Repeat("x", len(p.Secret))
	unknownID := "krane_c_aaaaaaaaaaaa_" + p.Secret
	secrets := []string{clusterOK, operatorOK, clusterRevoked, operatorRevoked, clusterRevokedOld, operatorRevokedOld, clusterExpired, operatorExpired}

	// own is the token of the kind the RPC needs; other the other kind.
	type tokens struct{ ok, revoked, revokedOld, expired string }
	tokensFor := func(r rpc) tokens {
		if r.cluster {
			return tokens{clusterOK, clusterRevoked, clusterRevokedOld, clusterExpired}
		}
		return tokens{operatorOK, operatorRevoked, operatorRevokedOld, operatorExpired}
	}

	// A case is one column of the matrix: the call's metadata and request,
	// and the code it must get; applies says for which RPCs it is defined.
	type cell struct {
		md      metadata.MD
		req     proto.Message
		want    codes.Code
		mention string // the status message must contain it (when set)
	}
	type testCase struct {
		name string
		make func(r rpc) (cell, bool)
	}
	same := func(want codes.Code, mention string, md func(tokens) metadata.MD) func(rpc) (cell, bool) {
		return func(r rpc) (cell, bool) {
			req, _ := r.request("")
			return cell{md: md(tokensFor(r)), req: req, want: want, mention: mention}, true
		}
	}
	cases := []testCase{
		{"no token", same(codes.Unauthenticated, "missing bearer token", func(tokens) metadata.MD { return metadata.MD{} })},
		{"malformed token", same(codes.Unauthenticated, "malformed", func(tokens) metadata.MD { return bearer("not-a-token") })},
		{"not a bearer token", same(codes.Unauthenticated, "Bearer", func(k tokens) metadata.MD { return metadata.Pairs("authorization", "Basic "+k.ok) })},
		{"wrong secret", same(codes.Unauthenticated, "unknown or revoked", func(tokens) metadata.MD { return bearer(wrongSecret) })},
		{"unknown token id", same(codes.Unauthenticated, "unknown or revoked", func(tokens) metadata.MD { return bearer(unknownID) })},
		{"revoked token (just now, on this ctrl)", same(codes.Unauthenticated, "was revoked", func(k tokens) metadata.MD { return bearer(k.revoked) })},
		{"revoked token (long ago)", same(codes.Unauthenticated, "was revoked", func(k tokens) metadata.MD { return bearer(k.revokedOld) })},
		{"expired token", same(codes.Unauthenticated, "expired at", func(k tokens) metadata.MD { return bearer(k.expired) })},
		{"other region's token (region metadata)", func(r rpc) (cell, bool) {
			req, _ := r.request("")
			return cell{md: bearer(clusterOK, auth.RegionHeader, "us"), req: req, want: codes.PermissionDenied, mention: "region"}, r.cluster
		}},
		{"other region's token (request region)", func(r rpc) (cell, bool) {
			req, hasRegion := r.request("us")
			return cell{md: bearer(clusterOK), req: req, want: codes.PermissionDenied, mention: "cannot read region"}, r.cluster && hasRegion
		}},
		{"other cluster's id (metadata)", func(r rpc) (cell, bool) {
			req, _ := r.request("")
			return cell{md: bearer(clusterOK, auth.ClusterIDHeader, "eu-2"), req: req, want: codes.PermissionDenied, mention: "cluster"}, r.cluster
		}},
		{"cluster token on the operator API", func(r rpc) (cell, bool) {
			req, _ := r.request("")
			return cell{md: bearer(clusterOK), req: req, want: codes.PermissionDenied, mention: "needs an operator token"}, !r.cluster
		}},
		{"operator token on the ClusterService", func(r rpc) (cell, bool) {
			req, _ := r.request("")
			return cell{md: bearer(operatorOK), req: req, want: codes.PermissionDenied, mention: "needs a cluster token"}, r.cluster
		}},
	}

	// A plain connection: each call brings its own metadata.
	conn, err := grpc.NewClient(env.Server.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	authCodes := []codes.Code{codes.Unauthenticated, codes.PermissionDenied}
	got := map[string]map[string]string{} // rpc -> case -> code
	refused, controls, clusterRPCs := 0, 0, 0
	for _, r := range rpcs {
		got[r.full] = map[string]string{}
		if r.cluster {
			clusterRPCs++
		}
		for _, c := range cases {
			cl, ok := c.make(r)
			if !ok {
				got[r.full][c.name] = "n/a"
				continue
			}
			refused++
			err := invoke(ctx, conn, r, cl.md, cl.req)
			got[r.full][c.name] = status.Code(err).String()
			if status.Code(err) != cl.want {
				t.Errorf("%s, %s: %v; want %s", r.full, c.name, err, cl.want)
				continue
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, cl.mention) {
				t.Errorf("%s, %s: message %q does not say %q", r.full, c.name, msg, cl.mention)
			}
			for _, s := range secrets {
				if strings.Contains(err.Error(), secretOf(s)) {
					t.Errorf("%s, %s: the error echoes a token secret: %v", r.full, c.name, err)
				}
			}
		}
		// Controls: the right token (with matching metadata) is not refused
		// by authentication; the handler's own answer may be anything else.
		k := tokensFor(r)
		mds := []metadata.MD{bearer(k.ok)}
		if r.cluster {
			mds = append(mds, bearer(k.ok, auth.RegionHeader, "eu", auth.ClusterIDHeader, "eu-1"))
		}
		for i, md := range mds {
			req, _ := r.request("eu")
			err := invoke(ctx, conn, r, md, req)
			controls++
			if slices.Contains(authCodes, status.Code(err)) {
				t.Errorf("%s, control %d (valid token): refused with %v", r.full, i, err)
			}
			got[r.full][fmt.Sprintf("control %d", i)] = status.Code(err).String()
		}
	}

	// The matrix, for the record.
	var b strings.Builder
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%s:", n)
		for _, c := range cases {
			fmt.Fprintf(&b, " %s", got[n][c.name])
		}
		fmt.Fprintf(&b, " | controls %s %s\n", got[n]["control 0"], got[n]["control 1"])
	}
	t.Logf("columns: %s\n%s", strings.Join(func() []string {
		var s []string
		for _, c := range cases {
			s = append(s, c.name)
		}
		return s
	}(), "; "), b.String())
	t.Logf("authn/z matrix: %d RPCs (%d ClusterService, %d operator API) x %d cases: %d refused cells checked for their exact code, %d controls passed authentication",
		len(rpcs), clusterRPCs, len(rpcs)-clusterRPCs, len(cases), refused, controls)
	if len(rpcs) < 20 || refused < 200 {
		t.Fatalf("the matrix is smaller than expected (%d RPCs, %d cells): did the ServiceDescs lose methods?", len(rpcs), refused)
	}
}

// watch is an open Watch stream whose end is reported on done.
type watch struct {
	done chan watchEnd
}

type watchEnd struct {
	at  time.Time
	err error
}

// openWatch opens a Watch of deployments with token on conn's server,
// reads its bootstrap marker, then reads on in the background until it
// ends.
func openWatch(t *testing.T, env *ctrltest.Env, token string) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := env.Cluster(t, token).Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Recv()
	if err != nil || ev.GetBootstrapComplete() == nil {
		t.Fatalf("first event of the watch: %v, %v; want the bootstrap marker", ev, err)
	}
	w := &watch{done: make(chan watchEnd, 1)}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				w.done <- watchEnd{at: time.Now(), err: err}
				return
			}
		}
	}()
	return w
}

// ended waits (at most within) for the stream to end with
// UNAUTHENTICATED saying mention, and returns when it ended.
func (w *watch) ended(t *testing.T, within time.Duration, mention string) time.Time {
	t.Helper()
	select {
	case e := <-w.done:
		if status.Code(e.err) != codes.Unauthenticated || !strings.Contains(status.Convert(e.err).Message(), mention) {
			t.Fatalf("the stream ended with %v; want Unauthenticated saying %q", e.err, mention)
		}
		return e.at
	case <-time.After(within):
		t.Fatalf("the stream is still open after %s", within)
		return time.Time{}
	}
}

// open asserts the stream has not ended.
func (w *watch) open(t *testing.T) {
	t.Helper()
	select {
	case e := <-w.done:
		t.Fatalf("the stream ended: %v", e.err)
	default:
	}
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut strings.Builder
	if code := cli.Main(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("ctrl %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String()
}

// revocationBound is how soon a revocation made elsewhere must end a stream:
// the default poll interval (250ms) with room for a loaded machine.
const revocationBound = 750 * time.Millisecond

func TestRevocationAndExpiryEndOpenStreams(t *testing.T) {
	// Two ctrls on one database, with the default revocation poll.
	a := ctrltest.Start(t, ctrltest.Options{})
	b := ctrltest.Start(t, ctrltest.Options{DSN: a.DSN})
	ctx := context.Background()
	if got := a.Server.Authenticator(); got == nil {
		t.Fatal("no authenticator")
	}

	t.Run("ctrl admin token revoke", func(t *testing.T) {
		token := a.ClusterToken(t, "eu", "eu-1")
		other := a.ClusterToken(t, "eu", "eu-1") // same cluster, not revoked
		p, _ := auth.Parse(token)
		onA, onB, untouched := openWatch(t, a, token), openWatch(t, b, token), openWatch(t, b, other)
		out := run(t, "admin", "token", "revoke", p.ID, "--db-dsn", a.DSN)
		committed := time.Now()
		if !strings.Contains(out, "revoked cluster token "+p.ID) {
			t.Fatalf("ctrl admin token revoke printed %q", out)
		}
		endA, endB := onA.ended(t, 5*time.Second, "was revoked"), onB.ended(t, 5*time.Second, "was revoked")
		t.Logf("`ctrl admin token revoke` ended the open streams %s (ctrl A) and %s (ctrl B) after it returned",
			endA.Sub(committed).Round(time.Millisecond), endB.Sub(committed).Round(time.Millisecond))
		for _, d := range []time.Duration{endA.Sub(committed), endB.Sub(committed)} {
			if d > revocationBound {
				t.Errorf("a stream ended %s after the revocation, want within %s", d, revocationBound)
			}
		}
		untouched.open(t)
		if _, err := a.Cluster(t, token).Heartbeat(ctx, &clusterv1.HeartbeatRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("a call with the revoked token: %v, want Unauthenticated", err)
		}
		if _, err := a.Cluster(t, other).Heartbeat(ctx, &clusterv1.HeartbeatRequest{}); err != nil {
			t.Errorf("a call with the cluster's other token: %v", err)
		}
	})

	t.Run("ctrl admin cluster revoke", func(t *testing.T) {
		t1, t2 := a.ClusterToken(t, "us", "us-1"), a.ClusterToken(t, "us", "us-1")
		w1, w2 := openWatch(t, a, t1), openWatch(t, b, t2)
		run(t, "admin", "cluster", "revoke", "--cluster", "us-1", "--db-dsn", a.DSN)
		committed := time.Now()
		e1, e2 := w1.ended(t, 5*time.Second, "was revoked"), w2.ended(t, 5*time.Second, "was revoked")
		t.Logf("`ctrl admin cluster revoke` ended the cluster's streams %s and %s after it returned",
			e1.Sub(committed).Round(time.Millisecond), e2.Sub(committed).Round(time.Millisecond))
		if d := max(e1.Sub(committed), e2.Sub(committed)); d > revocationBound {
			t.Errorf("a stream ended %s after the revocation, want within %s", d, revocationBound)
		}
	})

	t.Run("Revoke on one ctrl", func(t *testing.T) {
		token := a.ClusterToken(t, "ap", "ap-1")
		p, _ := auth.Parse(token)
		onA, onB := openWatch(t, a, token), openWatch(t, b, token)
		if n := a.Server.Authenticator().OpenStreams(p.ID); n != 1 {
			t.Fatalf("ctrl A has %d open streams of the token, want 1", n)
		}
		start := time.Now()
		if _, err := a.Server.Authenticator().Revoke(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		endA, endB := onA.ended(t, 5*time.Second, "was revoked"), onB.ended(t, 5*time.Second, "was revoked")
		t.Logf("Revoke on ctrl A ended its stream %s later, and ctrl B's (through its poll) %s later",
			endA.Sub(start).Round(time.Millisecond), endB.Sub(start).Round(time.Millisecond))
		if d := endA.Sub(start); d > 200*time.Millisecond {
			t.Errorf("the revoking ctrl's stream ended %s after Revoke, want at once", d)
		}
		if d := endB.Sub(start); d > revocationBound {
			t.Errorf("the other ctrl's stream ended %s after Revoke, want within %s", d, revocationBound)
		}
		if n := a.Server.Authenticator().OpenStreams(p.ID); n != 0 {
			t.Errorf("ctrl A still lists %d open streams of the revoked token", n)
		}
	})

	t.Run("expiry", func(t *testing.T) {
		out := run(t, "cluster", "register", "--region", "sa", "--cluster", "sa-1", "--expires-in", "1.5s", "--db-dsn", a.DSN)
		token := strings.TrimSpace(out)
		p, err := auth.Parse(token)
		if err != nil {
			t.Fatalf("register printed %q: %v", out, err)
		}
		tok, err := a.Store.LookupToken(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.ExpiresAt.Sub(tok.CreatedAt); got < 1499*time.Millisecond || got > 1500*time.Millisecond {
			t.Fatalf("stored expiry is %s after creation, want 1.5s", got)
		}
		onA, onB := openWatch(t, a, token), openWatch(t, b, token)
		endA, endB := onA.ended(t, 5*time.Second, "expired at"), onB.ended(t, 5*time.Second, "expired at")
		t.Logf("a token created with --expires-in 1.5s ended its open streams %s and %s after its creation (%s and %s after its expiry)",
			endA.Sub(tok.CreatedAt).Round(time.Millisecond), endB.Sub(tok.CreatedAt).Round(time.Millisecond),
			endA.Sub(tok.ExpiresAt).Round(time.Millisecond), endB.Sub(tok.ExpiresAt).Round(time.Millisecond))
		for _, end := range []time.Time{endA, endB} {
			if late := end.Sub(tok.ExpiresAt); late < -5*time.Millisecond || late > 300*time.Millisecond {
				t.Errorf("a stream ended %s from the token's expiry, want at it", late)
			}
		}
		_, err = a.Cluster(t, token).Heartbeat(ctx, &clusterv1.HeartbeatRequest{})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired at") || !strings.Contains(err.Error(), "ctrl admin cluster register --region sa --cluster sa-1") {
			t.Errorf("a call with the expired token: %v; want Unauthenticated saying it expired and how to get a new one", err)
		}
	})

	// The metrics count the streams ended, by reason.
	metrics := scrape(t, a)
	for _, want := range []string{`krane_ctrl_auth_streams_ended_total{reason="revoked"}`, `krane_ctrl_auth_streams_ended_total{reason="expired"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if strings.Contains(metrics, `krane_ctrl_auth_streams_ended_total{reason="revoked"} 0`) {
		t.Errorf("no stream counted as ended by revocation")
	}
}

func scrape(t *testing.T, env *ctrltest.Env) string {
	t.Helper()
	mfs, err := env.Server.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), v)
		}
	}
	return b.String()
}

// A revocation the poll cannot see (its revoked_at stamped by a clock an
// hour behind) is caught by the recheck of open streams.
func TestRecheckCatchesRevocationsThePollMisses(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) { c.Auth.RecheckInterval = time.Second }})
	token := env.ClusterToken(t, "eu", "eu-1")
	p, _ := auth.Parse(token)
	w := openWatch(t, env, token)
	skewed := time.Now().Add(-time.Hour).UnixMilli()
	if _, err := env.Store.DB().ExecContext(context.Background(), "UPDATE api_tokens SET revoked_at = ? WHERE id = ?", skewed, p.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	end := w.ended(t, 5*time.Second, "was revoked")
	t.Logf("a revocation stamped an hour in the past ended the stream %s later (recheck interval 1s)", end.Sub(start).Round(time.Millisecond))
	if d := end.Sub(start); d > 2*time.Second {
		t.Errorf("the recheck took %s, want within its 1s interval", d)
	}
}
