package deployapi_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestSentinelsGetListAndTokens(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	env.SentinelCluster(t, "eu", "eu-1")
	eu := env.CreateSentinels(t, "eu", "sen-eu", "registry.test/sentinel:1", 5)
	env.CreateSentinels(t, "us", "sen-us", "registry.test/sentinel:1", 3)
	api := env.Sentinels(t)
	ctx := context.Background()

	// Paging through one region, 2 at a time, in id order.
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		page, err := api.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{Region: "eu", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.GetSentinels() {
			got = append(got, s.GetId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if len(got) != 5 || got[0] != eu[0] || got[4] != eu[4] {
		t.Fatalf("eu sentinels: %v", got)
	}
	all, err := api.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{})
	if err != nil || len(all.GetSentinels()) != 8 {
		t.Fatalf("every sentinel: %v, %v", all, err)
	}
	byEnv, err := api.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{EnvironmentId: "env-" + eu[1]})
	if err != nil || len(byEnv.GetSentinels()) != 1 || byEnv.GetSentinels()[0].GetId() != eu[1] {
		t.Fatalf("one environment: %v, %v", byEnv, err)
	}
	for _, bad := range []*ctrlv1.ListSentinelsRequest{{PageSize: 501}, {PageToken: "!!"}, {Region: "EU WEST"}} {
		if _, err := api.ListSentinels(ctx, bad); code(err) != codes.InvalidArgument {
			t.Errorf("ListSentinels(%v): %v, want InvalidArgument", bad, err)
		}
	}

	// Get shows what the cluster reported.
	var s *ctrlv1.SentinelInfo
	for range 200 {
		if s, err = api.GetSentinel(ctx, &ctrlv1.GetSentinelRequest{SentinelId: eu[0]}); err == nil && s.GetHealth() == clusterv1.Health_HEALTH_HEALTHY {
			break
		}
		waitABit()
	}
	if s.GetRunningImage() != "registry.test/sentinel:1" || s.GetReportObservedVersion() != s.GetVersion() || s.GetDeployStatus() != "idle" ||
		s.GetRegion() != "eu" || s.GetReplicas() != 2 || s.GetEnvironmentId() != "env-"+eu[0] {
		t.Fatalf("GetSentinel: %v", s)
	}
	if _, err := api.GetSentinel(ctx, &ctrlv1.GetSentinelRequest{SentinelId: "nope"}); code(err) != codes.NotFound {
		t.Fatalf("unknown sentinel: %v", err)
	}

	// Cluster tokens are refused on both services.
	conn := env.Dial(t, env.ClusterToken(t, "eu", "eu-2"))
	if _, err := ctrlv1.NewSentinelServiceClient(conn).ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{}); code(err) != codes.PermissionDenied {
		t.Fatalf("sentinels with a cluster token: %v", err)
	}
	if _, err := ctrlv1.NewRolloutServiceClient(conn).GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); code(err) != codes.PermissionDenied {
		t.Fatalf("rollouts with a cluster token: %v", err)
	}
	if _, err := ctrlv1.NewRolloutServiceClient(env.Dial(t, "")).GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); code(err) != codes.Unauthenticated {
		t.Fatalf("rollouts without a token: %v", err)
	}
}

func waitABit() { time.Sleep(25 * time.Millisecond) }
