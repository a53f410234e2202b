package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

func TestFleetList(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	eu := env.ClusterToken(t, "eu", "eu-1")
	env.ClusterToken(t, "us", "us-1")
	if _, err := env.Cluster(t, eu).Heartbeat(t.Context(), &clusterv1.HeartbeatRequest{AgentVersion: "7.7.7", Cursors: map[string]uint64{"deployment": 0}}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))

	code, out, errOut := run(t, "fleet", "list")
	if code != 0 {
		t.Fatalf("fleet list: exit %d\n%s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "REGION") ||
		!strings.Contains(lines[1], "eu-1") || !strings.Contains(lines[1], "7.7.7") || !strings.Contains(lines[1], "deployment") ||
		!strings.Contains(lines[2], "us-1") || !strings.Contains(lines[2], "never") {
		t.Fatalf("fleet list:\n%s", out)
	}
	code, out, _ = run(t, "fleet", "list", "--region", "us", "-o", "json")
	var doc struct {
		Clusters []struct{ ID, Region string } `json:"clusters"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Clusters) != 1 || doc.Clusters[0].ID != "us-1" {
		t.Fatalf("fleet list --region us -o json: exit %d, %v\n%s", code, err, out)
	}
	t.Setenv("CTRL_TOKEN", eu)
	if code, _, errOut := run(t, "fleet", "list"); code == 0 || !strings.Contains(errOut, "operator token") {
		t.Fatalf("fleet list with a cluster token: exit %d\n%s", code, errOut)
	}
}
