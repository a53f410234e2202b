package agent

import (
	"context"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/host/config"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// recordingCtrl answers DecryptEnv for any id and records which ids
// reached it.
type recordingCtrl struct {
	clusterv1.ClusterServiceClient
	mu  sync.Mutex
	ids []string
}

func (r *recordingCtrl) DecryptEnv(_ context.Context, req *clusterv1.DecryptEnvRequest, _ ...grpc.CallOption) (*clusterv1.DecryptEnvResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, req.GetDeploymentId())
	return &clusterv1.DecryptEnvResponse{Env: map[string]string{"K": "v"}}, nil
}

// TestDecryptEnvOnlyForTheKindOfTheSecrets: the host lets a plugin open a
// sentinel's credentials (a sen_ id) only when it reconciles kind
// sentinel, and a deployment's secrets only when it reconciles kind
// deployment. A refused request never reaches ctrl.
func TestDecryptEnvOnlyForTheKindOfTheSecrets(t *testing.T) {
	a := New(&config.Config{Region: "r1", ClusterID: "c1"}, hclog.NewNullLogger(), Options{})
	rec := &recordingCtrl{}
	a.mu.Lock()
	a.client = rec
	a.kindOwner[kinds.Deployment] = "deployment"
	a.kindOwner[kinds.Sentinel] = "sentinel"
	a.kindOwner["thing.example"] = "cilium"
	a.mu.Unlock()
	ctx := context.Background()
	blob := []byte("sealed")

	for _, c := range []struct {
		controller, id string
		allowed        bool
	}{
		{"sentinel", "sen_abc", true},
		{"deployment", "dep_abc", true},
		{"deployment", "sen_abc", false}, // the deployment plugin may not open a sentinel's credentials
		{"cilium", "sen_abc", false},
		{"sentinel", "dep_abc", false},
		{"cilium", "dep_abc", false},
	} {
		env, err := a.HostFor(c.controller).DecryptEnv(ctx, c.id, blob)
		switch {
		case c.allowed && (err != nil || env["K"] != "v"):
			t.Errorf("%s opening %s: %v, want the values from ctrl", c.controller, c.id, err)
		case !c.allowed && status.Code(err) != codes.PermissionDenied:
			t.Errorf("%s opening %s: %v, want PermissionDenied", c.controller, c.id, err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ids) != 2 || rec.ids[0] != "sen_abc" || rec.ids[1] != "dep_abc" {
		t.Errorf("ctrl was asked for %v, want only the two allowed requests", rec.ids)
	}
}
