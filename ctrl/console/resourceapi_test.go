package console_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestResourcesPageReadsTheResourceAPI: the Resources page reads
// the resource API, so an object put there shows with its desired
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

// TestResourcesPageShowsEachRegion: per object and region the desired and
// applied versions, the status the cluster reported, the clusters' apply
// errors, and "behind" where a region's cluster has not applied the
// desired version yet, all read from the resource API.
func TestResourcesPageShowsEachRegion(t *testing.T) {
	env := startCtrl(t)
	ctx := context.Background()
	op := env.OperatorToken(t, "frank")
	res := ctrlv1.NewResourceServiceClient(env.Dial(t, op))
	const kind = "configmap.example.dev"
	if _, err := res.RegisterKind(ctx, &ctrlv1.RegisterKindRequest{Kind: kind,
		SpecSchema: `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"key":{"type":"string"}}}`}); err != nil {
		t.Fatal(err)
	}
	put := func(value string) map[string]uint64 {
		t.Helper()
		spec, err := structpb.NewStruct(map[string]any{"key": value})
		if err != nil {
			t.Fatal(err)
		}
		out, err := res.PutResources(ctx, &ctrlv1.PutResourcesRequest{Resources: []*ctrlv1.Resource{{Kind: kind, Id: "cm-1", Regions: []string{"eu", "us"}, Spec: spec}}})
		if err != nil {
			t.Fatal(err)
		}
		versions := map[string]uint64{}
		for _, r := range out.GetResults()[0].GetRegions() {
			versions[r.GetRegion()] = r.GetVersion()
		}
		return versions
	}
	v := put("a")
	status, err := structpb.NewStruct(map[string]any{"ok": true})
	if err != nil {
		t.Fatal(err)
	}
	packed, err := anypb.New(status)
	if err != nil {
		t.Fatal(err)
	}
	// A cluster's reports count in its region's roll-up once it has sent a
	// heartbeat.
	us := env.Cluster(t, env.ClusterToken(t, "us", "us-1"))
	if _, err := us.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := us.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kind, Id: "cm-1", ObservedVersion: v["us"], Status: packed}); err != nil {
		t.Fatal(err)
	}
	// eu's cluster refuses its version: parked, and behind.
	eu := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	if _, err := eu.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kind, Id: "cm-1", ObservedVersion: v["eu"],
		ApplyError: &clusterv1.ApplyError{Version: v["eu"], Message: "data.key: too long", Permanent: true, Field: "key"}}); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(op)
	resp, body := b.get("/resources?kind=" + kind)
	for _, want := range []string{kind, "cm-1", "eu", "us", strconv.FormatUint(v["eu"], 10), strconv.FormatUint(v["us"], 10),
		"data.key: too long", "parked", "behind", `&#34;ok&#34;:true`} {
		if !strings.Contains(body, want) {
			t.Errorf("/resources does not show %q: %s\n%s", want, resp.Status, body)
		}
	}
}
