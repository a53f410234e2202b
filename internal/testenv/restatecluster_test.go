package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/server"

	"krane.dev/internal/testenv"
)

// TestRestateClusterSurvivesANodeKill: a three-node cluster registers an
// endpoint through one node, serves calls through every node's ingress,
// and keeps its state and serves on after one node is killed (SIGKILL):
// the node that provisioned it and took the registration.
func TestRestateClusterSurvivesANodeKill(t *testing.T) {
	c, err := testenv.StartRestateCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	handler, err := server.NewRestate().WithIdentityV1(c.IdentityKey()).Bind(restate.Reflect(Counter{})).Handler()
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.ServeH2C(t, handler)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.Nodes[0].Register(ctx, url, false); err != nil {
		t.Fatal(err)
	}
	// Calls through each node, each counter key in its own partition.
	call := func(n *testenv.Restate, key string, idem string) int64 {
		t.Helper()
		var got int64
		deadline := time.Now().Add(90 * time.Second)
		for {
			err := n.Call(ctx, "Counter/"+key+"/Add", 1, &got, map[string]string{"idempotency-key": idem})
			if err == nil {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("Counter/%s/Add through %s: %v", key, n.IngressURL(), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for i, n := range c.Nodes {
		for _, k := range keys {
			call(n, k, fmt.Sprintf("before-%d-%s", i, k))
		}
	}
	// The node that provisioned the cluster, and registered the endpoint.
	c.Nodes[0].Kill()
	begin := time.Now()
	for i, n := range c.Nodes[1:] {
		for _, k := range keys {
			if got := call(n, k, fmt.Sprintf("after-%d-%s", i, k)); got != int64(4+i) {
				t.Fatalf("counter %s through node %d after the kill = %d, want %d", k, i+2, got, 4+i)
			}
		}
	}
	t.Logf("a node killed: every counter answered through the other two nodes %s later, its count intact", time.Since(begin).Round(time.Millisecond))
}
