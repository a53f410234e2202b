package console_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/cli"
	"krane.dev/ctrl/clusterapi"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestLargestStatusesListThroughTheCLIAndTheConsole fills objects with
// the largest statuses a cluster may send (clusterapi's bound on a
// generic status), from four clusters each, and lists them all: `ctrl
// resource list` and the console's Resources page page by bytes, and each
// object too large for its page's budget has its largest statuses left
// out with a marker. Before, one page of twelve such objects was larger
// than ctrl's 16 MiB send limit and both failed for every operator.
func TestLargestStatusesListThroughTheCLIAndTheConsole(t *testing.T) {
	env := startCtrl(t)
	ctx := context.Background()
	op := env.OperatorToken(t, "grace")
	res := ctrlv1.NewResourceServiceClient(env.Dial(t, op))
	const kind, objects = "blob.example.dev", 15
	if _, err := res.RegisterKind(ctx, &ctrlv1.RegisterKindRequest{Kind: kind, SpecSchema: `{"type":"object"}`}); err != nil {
		t.Fatal(err)
	}
	var put []*ctrlv1.Resource
	for i := range objects {
		spec, _ := structpb.NewStruct(map[string]any{"n": float64(i)})
		put = append(put, &ctrlv1.Resource{Kind: kind, Id: fmt.Sprintf("big-%02d", i), Regions: []string{"eu"}, Spec: spec})
	}
	answer, err := res.PutResources(ctx, &ctrlv1.PutResourcesRequest{Resources: put})
	if err != nil {
		t.Fatal(err)
	}
	// The largest status the boundary allows: its JSON just under the bound.
	filler := strings.Repeat("x", clusterapi.MaxGenericStatusBytes-64)
	for _, cluster := range []string{"eu-1", "eu-2", "eu-3", "eu-4"} {
		c := env.Cluster(t, env.ClusterToken(t, "eu", cluster))
		// A heartbeat that does not say which controllers run: the
		// cluster counts for every kind.
		if _, err := c.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "test"}); err != nil {
			t.Fatal(err)
		}
		for i, r := range answer.GetResults() {
			st, _ := structpb.NewStruct(map[string]any{"blob": filler, "cluster": cluster})
			if _, err := c.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kind, Id: put[i].GetId(), ObservedVersion: r.GetRegions()[0].GetVersion(),
				Status: mustAny(t, st)}); err != nil {
				t.Fatalf("cluster %s reports on %s: %v", cluster, put[i].GetId(), err)
			}
		}
	}

	// The CLI lists them all.
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", op)
	var out, errOut bytes.Buffer
	if code := cli.Main(ctx, []string{"resource", "list", kind}, &out, &errOut); code != 0 {
		t.Fatalf("ctrl resource list: exit %d\n%s", code, errOut.String())
	}
	for _, p := range put {
		if !strings.Contains(out.String(), p.GetId()) {
			t.Errorf("ctrl resource list does not show %s:\n%.2000s", p.GetId(), out.String())
		}
	}
	out.Reset()
	if code := cli.Main(ctx, []string{"resource", "get", kind, "big-00"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "left out to keep the answer small") {
		t.Fatalf("ctrl resource get: exit %d, want the left-out marker\n%.2000s%s", code, out.String(), errOut.String())
	}

	// The console lists them all, page after page.
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(op)
	next := regexp.MustCompile(`href="(/resources\?[^"]*page=[^"]+)">Next page<`)
	seen, pages := map[string]bool{}, 0
	for path := "/resources?kind=" + kind; path != ""; pages++ {
		resp, body := b.get(path)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s\n%.2000s", path, resp.Status, body)
		}
		for _, p := range put {
			if strings.Contains(body, ">"+p.GetId()+"<") {
				seen[p.GetId()] = true
			}
		}
		if pages == 0 && !strings.Contains(body, "left out of the list") {
			t.Errorf("the first page shows no left-out marker:\n%.2000s", body)
		}
		path = ""
		if m := next.FindStringSubmatch(body); m != nil {
			path = html.UnescapeString(m[1])
		}
		if pages > objects {
			t.Fatal("the console's pages do not end")
		}
	}
	if len(seen) != objects || pages < 2 {
		t.Fatalf("the console showed %d of %d objects in %d pages, want all of them over several pages (paged by bytes)", len(seen), objects, pages)
	}
}

func mustAny(t *testing.T, m *structpb.Struct) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
