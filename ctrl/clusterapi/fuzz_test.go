package clusterapi_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// FuzzReportStatus sends arbitrary ReportStatus messages (decoded from the
// fuzzer's bytes) through real gRPC, with a real cluster token, to a real
// ctrl on MySQL. Whatever a cluster sends, ctrl answers with a clear code
// (OK, InvalidArgument, NotFound, or Unavailable for a missing object
// state), never Internal or Unknown, and never crashes.
func FuzzReportStatus(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	pack := func(m proto.Message) *anypb.Any { a, _ := anypb.New(m); return a }
	st, _ := structpb.NewStruct(map[string]any{"present": true, "n": 3.0})
	seed(&clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "dep-fuzz", ObservedVersion: 1, ObservedAt: timestamppb.Now(),
		Status: pack(&clusterv1.DeploymentStatus{DeploymentId: "dep-fuzz", Instances: []*clusterv1.Instance{{K8SName: "p", Address: "10.0.0.1:8080", Status: clusterv1.Instance_STATUS_RUNNING}}})})
	seed(&clusterv1.ReportStatusRequest{Kind: kinds.Sentinel, Id: "s", Status: pack(&clusterv1.SentinelStatus{SentinelId: "s", Health: clusterv1.Health_HEALTH_HEALTHY})})
	seed(&clusterv1.ReportStatusRequest{Kind: kinds.CiliumNetworkPolicy, Id: "p", Status: pack(&clusterv1.CiliumNetworkPolicyStatus{Id: "p", Applied: true})})
	seed(&clusterv1.ReportStatusRequest{Kind: "thing.example.dev", Id: "t", Status: pack(st)})
	seed(&clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "dep-fuzz", Status: &anypb.Any{TypeUrl: "type.googleapis.com/krane.cluster.v1.DeploymentStatus", Value: []byte{0xff, 0xff}}})
	seed(&clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "dep-fuzz", ApplyError: &clusterv1.ApplyError{Version: 1, Message: "bad", Permanent: true}})
	seed(&clusterv1.ReportStatusRequest{Kind: "", Id: ""})

	env := ctrltest.Start(f, ctrltest.Options{Configure: fastConfig})
	putDeployment(f, env.Store, "dep-fuzz", "eu", "registry.example/app:1", 2, "running")
	cl := env.Cluster(f, env.ClusterToken(f, "eu", "eu-1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req clusterv1.ReportStatusRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cl.ReportStatus(ctx, &req)
		switch status.Code(err) {
		case codes.OK, codes.InvalidArgument, codes.NotFound:
		default:
			t.Fatalf("ReportStatus(%v) = %v: want OK, InvalidArgument or NotFound", &req, err)
		}
	})
}
