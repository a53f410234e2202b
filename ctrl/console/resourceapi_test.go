package console_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestResourcesPageReadsTheResourceAPI: ctrl serve wires the Resources page
// to the resource API, so an object put there shows with its desired
// version, and a cluster's parked apply error shows beside it.
func TestResourcesPageReadsTheResourceAPI(t *testing.T) {
	env := startCtrl(t)
	ctx := context.Background()
	op := env.OperatorToken(t, "grace")
	res := ctrlv1.NewResourceServiceClient(env.Dial(t, op))
	const kind = "quota.example.dev"
	if _, err := res.RegisterKind(ctx, &ctrlv1.RegisterKindRequest{Kind: kind,
		SpecSchema: `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"pods":{"type":"integer"}}}`}); err != nil {
		t.Fatal(err)
	}
	spec, err := structpb.NewStruct(map[string]any{"pods": 3})
	if err != nil {
		t.Fatal(err)
	}
	put, err := res.PutResources(ctx, &ctrlv1.PutResourcesRequest{Resources: []*ctrlv1.Resource{{Kind: kind, Id: "team-a", Regions: []string{"eu"}, Spec: spec}}})
	if err != nil {
		t.Fatal(err)
	}
	version := put.GetResults()[0].GetRegions()[0].GetVersion()
	eu := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	if _, err := eu.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kind, Id: "team-a", ObservedVersion: version,
		ApplyError: &clusterv1.ApplyError{Version: version, Message: "pods: the namespace's limit is 2", Permanent: true, Field: "pods"}}); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(op)
	resp, body := b.get("/resources?kind=" + kind)
	for _, want := range []string{kind, "team-a", "eu", strconv.FormatUint(version, 10), "the namespace&#39;s limit is 2", "parked"} {
		if !strings.Contains(body, want) {
			t.Errorf("/resources does not show %q: %s\n%s", want, resp.Status, body)
		}
	}
}
