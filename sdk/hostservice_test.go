package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// hostUser is a plugin that keeps the Host it was configured with.
type hostUser struct {
	mu   sync.Mutex
	host sdk.Host
}

func (p *hostUser) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{Name: "hostuser", Version: "0.0.1", Kinds: []sdk.KindInfo{{Kind: "thing", SpecType: "google.protobuf.Struct"}}}}, nil
}

func (p *hostUser) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.host = req.Host
	return &sdk.ConfigureResponse{}, nil
}

func (p *hostUser) Host() sdk.Host {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.host
}

func (p *hostUser) Apply(context.Context, *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return sdk.Done(sdk.Unchanged, nil)
}
func (p *hostUser) Inventory(context.Context, *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	return &sdk.InventoryResponse{}, nil
}

// testHost answers DecryptEnv like ctrl would.
type testHost struct {
	name  string
	mu    sync.Mutex
	calls []string
	blobs [][]byte
}

func (h *testHost) DecryptEnv(_ context.Context, id string, sealed []byte) (map[string]string, error) {
	h.mu.Lock()
	h.calls, h.blobs = append(h.calls, id), append(h.blobs, slices.Clone(sealed))
	h.mu.Unlock()
	switch id {
	case "dep_denied":
		return nil, fmt.Errorf("ctrl: %w", status.Error(codes.PermissionDenied, "deployment dep_denied is not scheduled to run in region eu"))
	case "dep_broken":
		return nil, errors.New("ctrl is unreachable")
	}
	return map[string]string{"FROM": h.name, "ID": id}, nil
}

func configure(t *testing.T, ctl sdk.Controller, host sdk.Host) {
	t.Helper()
	if _, err := ctl.Configure(context.Background(), &sdk.ConfigureRequest{Region: "eu", ClusterID: "eu-1", Config: []byte("{}"), Host: host}); err != nil {
		t.Fatal(err)
	}
}

// TestHostIsBrokered: a test Host reaches the plugin through go-plugin's
// real broker; values, errors (with ctrl's code) and a reconfiguration pass
// through; a host without services answers ErrNoHostService.
func TestHostIsBrokered(t *testing.T) {
	plug := &hostUser{}
	first := &testHost{name: "first"}
	ctl := plugintest.New(t, plug, plugintest.WithHost(first))
	configure(t, ctl, nil)
	h := plug.Host()
	if h == nil || fmt.Sprintf("%T", h) == fmt.Sprintf("%T", first) {
		t.Fatalf("the plugin got %T, want the brokered client", h)
	}
	ctx := context.Background()
	sealed := []byte{0, 1, 2, 0xff}
	env, err := h.DecryptEnv(ctx, "dep_a", sealed)
	if err != nil || !maps.Equal(env, map[string]string{"FROM": "first", "ID": "dep_a"}) {
		t.Fatalf("DecryptEnv through the broker: %v, %v", env, err)
	}
	if len(first.blobs) != 1 || string(first.blobs[0]) != string(sealed) {
		t.Fatalf("the host got %q, want the plugin's bytes", first.blobs)
	}
	_, err = h.DecryptEnv(ctx, "dep_denied", sealed)
	if err == nil || !strings.Contains(err.Error(), "is not scheduled to run in region eu") || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "dep_denied") {
		t.Fatalf("a refusal: %v, want ctrl's reason and code", err)
	}
	if _, err = h.DecryptEnv(ctx, "dep_broken", sealed); err == nil || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("a host failure: %v, want Unavailable with the reason", err)
	}

	// Latency of the plugin -> host hop (the part a plugin adds to ctrl's).
	const n = 500
	lat := make([]time.Duration, n)
	for i := range lat {
		start := time.Now()
		if _, err := h.DecryptEnv(ctx, "dep_a", sealed); err != nil {
			t.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	slices.Sort(lat)
	t.Logf("DecryptEnv plugin -> host over the go-plugin broker, %d calls: p50 %s, p99 %s", n, lat[n/2], lat[n*99/100])

	// A new Configure with another Host: the same broker connection, the new
	// implementation.
	second := &testHost{name: "second"}
	configure(t, ctl, second)
	if env, err := plug.Host().DecryptEnv(ctx, "dep_b", nil); err != nil || env["FROM"] != "second" {
		t.Fatalf("after reconfiguring: %v, %v", env, err)
	}

	// Without a Host, the plugin still gets one, which says why it fails.
	bare := &hostUser{}
	configure(t, plugintest.New(t, bare), nil)
	if _, err := bare.Host().DecryptEnv(ctx, "dep_a", sealed); !errors.Is(err, sdk.ErrNoHostService) {
		t.Fatalf("no host services: %v, want ErrNoHostService", err)
	}
}

// TestServeWithHost: Serve's WithHost gives the plugin the test Host
// whatever the attached host sends.
func TestServeWithHost(t *testing.T) {
	plug := &hostUser{}
	h := &testHost{name: "override"}
	rc := plugintest.Serve(t, plug, plugintest.WithHost(h))
	cfg, err := sdk.NewClientConfig(sdk.ClientOptions{Reattach: rc})
	if err != nil {
		t.Fatal(err)
	}
	client := plugin.NewClient(cfg)
	t.Cleanup(client.Kill)
	ctl, err := sdk.Dispense(client)
	if err != nil {
		t.Fatal(err)
	}
	configure(t, ctl, &testHost{name: "attached host"})
	if env, err := plug.Host().DecryptEnv(context.Background(), "dep_a", nil); err != nil || env["FROM"] != "override" {
		t.Fatalf("Serve WithHost: %v, %v", env, err)
	}
}

// desiredTestHost answers GetDesiredState too.
type desiredTestHost struct{ testHost }

func (h *desiredTestHost) GetDesiredState(_ context.Context, kind, id string) (sdk.Change, error) {
	if id == "gone" {
		return sdk.Change{}, status.Errorf(codes.NotFound, "no %s %s", kind, id)
	}
	return sdk.Change{Kind: kind, ID: id, Version: 7, Spec: sdk.Spec{TypeURL: "type.googleapis.com/google.protobuf.Struct", Value: []byte{0x0a, 0x00}}}, nil
}

// TestDesiredStateIsBrokered: GetDesiredState crosses the broker with the
// change intact and ctrl's status code; a host that does not implement
// it answers Unimplemented.
func TestDesiredStateIsBrokered(t *testing.T) {
	ctx := context.Background()
	p := &hostUser{}
	ctl := plugintest.New(t, p)
	configure(t, ctl, &desiredTestHost{testHost{name: "a"}})
	ds, ok := p.Host().(sdk.DesiredStates)
	if !ok {
		t.Fatalf("the plugin's Host %T does not offer GetDesiredState", p.Host())
	}
	ch, err := ds.GetDesiredState(ctx, "thing", "t1")
	if err != nil {
		t.Fatal(err)
	}
	if ch.Kind != "thing" || ch.ID != "t1" || ch.Version != 7 || ch.Deleted || ch.Spec.TypeURL != "type.googleapis.com/google.protobuf.Struct" || len(ch.Spec.Value) != 2 {
		t.Errorf("change %+v", ch)
	}
	if _, err := ds.GetDesiredState(ctx, "thing", "gone"); status.Code(err) != codes.NotFound {
		t.Errorf("missing object: %v, want NotFound", err)
	}

	p2 := &hostUser{}
	ctl2 := plugintest.New(t, p2)
	configure(t, ctl2, &testHost{name: "old"})
	_, err = p2.Host().(sdk.DesiredStates).GetDesiredState(ctx, "thing", "t1")
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("host without the capability: %v, want Unimplemented", err)
	}
}
