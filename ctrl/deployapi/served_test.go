package deployapi_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// TestDeployFailsFastWithoutALiveController: a deploy to a region where no
// cluster heard from within deploy.live_cluster_within runs a controller
// for its kind is refused at once, naming the region and what is there
// (the controllers that do run, the one that failed and why, a silent
// cluster's last heartbeat, a cluster never heard from), and nothing is
// created. A live host that does not report controllers (older than ctrl)
// is trusted. The same holds for a sentinel deploy and kind "sentinel".
func TestDeployFailsFastWithoutALiveController(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	ctx := context.Background()
	api := env.Deployments(t)
	heartbeat := func(c clusterv1.ClusterServiceClient, ctls ...*clusterv1.ControllerStatus) {
		t.Helper()
		if _, err := c.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "t", HostReport: true, Controllers: ctls}); err != nil {
			t.Fatal(err)
		}
	}
	sentinel := &clusterv1.ControllerStatus{Name: "sentinel", PluginVersion: "1", Kinds: []string{kinds.Sentinel}, Running: true}
	cilium := &clusterv1.ControllerStatus{Name: "cilium", PluginVersion: "1", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true}
	crashed := &clusterv1.ControllerStatus{Name: "deployment", PluginVersion: "1", Kinds: []string{kinds.Deployment}, Running: false,
		LastError: "plugin process exited unexpectedly"}

	eu := env.Cluster(t, env.ClusterToken(t, "eu-west", "eu-west-1"))
	heartbeat(eu, sentinel, cilium, crashed)
	us := env.Cluster(t, env.ClusterToken(t, "us", "us-1"))
	heartbeat(us, ctrltest.BuiltinControllers()...)
	if _, err := env.Store.DB().ExecContext(ctx, "UPDATE clusters SET last_heartbeat_at = last_heartbeat_at - 720000 WHERE id = 'us-1'"); err != nil {
		t.Fatal(err)
	}
	env.ClusterToken(t, "ap", "ap-1") // never heard from

	refused := func(regions []string, want ...string) {
		t.Helper()
		r := req("env-fast", "registry.test/app:1")
		r.Regions = regions
		_, err := api.CreateDeployment(ctx, r)
		if code(err) != codes.FailedPrecondition {
			t.Fatalf("deploy to %v: %v, want FailedPrecondition", regions, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("deploy to %v: %q does not say %q", regions, err, w)
			}
		}
	}
	refused([]string{"eu-west"}, `region "eu-west": no live cluster runs a controller for kind "deployment"`,
		"cluster eu-west-1 runs: sentinel, cilium", "controller deployment is not running: plugin process exited unexpectedly")
	refused([]string{"us"}, `region "us"`, "last heartbeat from cluster us-1 12m0s ago")
	refused([]string{"ap"}, `region "ap"`, "cluster ap-1 has never sent a heartbeat")
	refused(nil, `region "ap"`, `region "eu-west"`, `region "us"`) // every region with a cluster
	list, err := api.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: "env-fast"})
	if err != nil || len(list.GetDeployments()) != 0 {
		t.Fatalf("refused deploys left deployments behind: %v, %v", list.GetDeployments(), err)
	}

	// The deployment controller is back: the deploy goes through.
	heartbeat(eu, sentinel, cilium, ctrltest.BuiltinControllers()[1])
	r := req("env-fast", "registry.test/app:1")
	r.Regions = []string{"eu-west"}
	if _, err := api.CreateDeployment(ctx, r); err != nil {
		t.Fatalf("deploy to eu-west with its deployment controller running: %v", err)
	}
	// us-1 upgrades... to an older host, which reports no controllers: trusted.
	if _, err := us.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "old"}); err != nil {
		t.Fatal(err)
	}
	r.Regions = []string{"us"}
	if _, err := api.CreateDeployment(ctx, r); err != nil {
		t.Fatalf("deploy to us, whose live host does not report controllers: %v", err)
	}

	// A sentinel in a region whose host runs no sentinel controller.
	heartbeat(eu, cilium, ctrltest.BuiltinControllers()[1])
	ids := env.CreateSentinels(t, "eu-west", "sen-fast", "registry.test/sentinel:1", 1)
	_, err = env.Sentinels(t).DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: ids[0], Image: "registry.test/sentinel:2"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `region "eu-west": no live cluster runs a controller for kind "sentinel"`) ||
		!strings.Contains(err.Error(), "cluster eu-west-1 runs: cilium, deployment") {
		t.Fatalf("sentinel deploy without a sentinel controller: %v", err)
	}
	row, err := env.Store.GetSentinel(ctx, ids[0])
	if err != nil || row.Image != "registry.test/sentinel:1" {
		t.Fatalf("the refused sentinel deploy changed the sentinel: %+v, %v", row, err)
	}
}

// TestDeployFailsFastWhenItsSentinelHasNoController: a deploy into an
// environment without a running sentinel in a region creates (or starts)
// one there and waits for it; when no live cluster of the region runs the
// sentinel controller it is refused at once, naming the region and what
// to do, and nothing is created. An environment whose sentinel is running
// deploys as before: its sentinel is not touched.
func TestDeployFailsFastWhenItsSentinelHasNoController(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	ctx := context.Background()
	api := env.Deployments(t)
	builtin := ctrltest.BuiltinControllers()
	cilium, deployment := builtin[0], builtin[1]
	eu := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	if _, err := eu.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "t", HostReport: true, Controllers: []*clusterv1.ControllerStatus{cilium, deployment}}); err != nil {
		t.Fatal(err)
	}
	// An environment that already has its sentinel in eu.
	withSentinel := env.CreateSentinels(t, "eu", "sen-have", "registry.test/sentinel:1", 1)[0]
	haveEnv := "env-" + withSentinel

	deploy := func(environment string) error {
		r := req(environment, "registry.test/app:1")
		r.Regions = []string{"eu"}
		_, err := api.CreateDeployment(ctx, r)
		return err
	}
	// refused: the deploy fails fast and the environment keeps its had
	// deployments.
	refused := func(environment string, had int) {
		t.Helper()
		err := deploy(environment)
		if code(err) != codes.FailedPrecondition {
			t.Fatalf("deploy into %s, which needs a sentinel in eu: %v, want FailedPrecondition", environment, err)
		}
		for _, want := range []string{environment, `region "eu": no live cluster runs a controller for kind "sentinel"`,
			"cluster eu-1 runs: cilium, deployment", "enable the `sentinel` controller", "krane.hcl"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("deploy into %s: %q does not say %q", environment, err, want)
			}
		}
		list, err := api.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: environment})
		if err != nil || len(list.GetDeployments()) != had {
			t.Fatalf("the refused deploy into %s left deployments behind: %v, %v", environment, list.GetDeployments(), err)
		}
	}
	refused("env-new", 0)
	if rows, err := env.Store.ListSentinels(ctx, store.SentinelFilter{EnvironmentID: "env-new"}, "", 10); err != nil || len(rows) != 0 {
		t.Fatalf("the refused deploy left sentinels behind: %+v, %v", rows, err)
	}

	// Its sentinel runs already: the deploy does not need the controller.
	if err := deploy(haveEnv); err != nil {
		t.Fatalf("deploy into %s, whose sentinel in eu is running: %v", haveEnv, err)
	}
	// Stopped, the deploy would start it again: refused too.
	if _, _, err := env.Store.StopSentinel(ctx, withSentinel); err != nil {
		t.Fatal(err)
	}
	refused(haveEnv, 1)

	// The sentinel controller runs in eu: the deploy goes through.
	if _, err := eu.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "t", HostReport: true, Controllers: builtin}); err != nil {
		t.Fatal(err)
	}
	if err := deploy("env-new"); err != nil {
		t.Fatalf("deploy into env-new with eu's sentinel controller running: %v", err)
	}
}
