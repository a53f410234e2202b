package ctrltest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// Deployments is a DeploymentService client with an operator token.
func (e *Env) Deployments(t testing.TB) ctrlv1.DeploymentServiceClient {
	t.Helper()
	return ctrlv1.NewDeploymentServiceClient(e.Dial(t, e.OperatorToken(t, "test operator")))
}

// FakeCluster plays one cluster's krane agent: it reports instances of
// deployments through the real ClusterService with a cluster token, and
// runs a fake sentinel plugin (Sentinels) on the same token, which reports
// every sentinel of the region healthy unless the test holds or breaks it:
// a deploy waits for the sentinels it creates.
type FakeCluster struct {
	Region, ID string
	Client     clusterv1.ClusterServiceClient
	Sentinels  *SentinelCluster
}

// FakeCluster registers a cluster and returns its fake agent, which sends
// heartbeats naming the built-in controllers until the test ends.
func (e *Env) FakeCluster(t testing.TB, region, clusterID string) *FakeCluster {
	t.Helper()
	return NewFakeCluster(t, region, clusterID, e.Cluster(t, e.ClusterToken(t, region, clusterID)))
}

// NewFakeCluster is a FakeCluster on a client the test made (a token of its
// own), with its fake sentinel plugin started (which heartbeats until the
// test ends).
func NewFakeCluster(t testing.TB, region, clusterID string, client clusterv1.ClusterServiceClient) *FakeCluster {
	t.Helper()
	c := &FakeCluster{Region: region, ID: clusterID, Client: client}
	c.Sentinels = startSentinelCluster(t, region, clusterID, client, false)
	return c
}

// Serve says in the cluster's heartbeats that its host runs a controller
// of kinds (beside the built-in ones).
func (c *FakeCluster) Serve(t testing.TB, kinds ...string) {
	t.Helper()
	c.Sentinels.Heartbeats.Serve(t, kinds...)
}

// Version is the deployment's current version in the cluster's region.
func (c *FakeCluster) Version(t testing.TB, deploymentID string) (uint64, bool) {
	t.Helper()
	ch, err := c.Client.GetDesiredState(context.Background(), &clusterv1.GetDesiredStateRequest{Kind: kinds.Deployment, Id: deploymentID})
	if err != nil {
		t.Fatalf("cluster %s: desired state of %s: %v", c.ID, deploymentID, err)
	}
	return ch.GetVersion(), ch.GetDeleted()
}

// Report sends a full snapshot of the deployment's instances, observed at
// its current version.
func (c *FakeCluster) Report(t testing.TB, deploymentID string, instances ...*clusterv1.Instance) {
	t.Helper()
	v, _ := c.Version(t, deploymentID)
	ready := int32(0)
	for _, in := range instances {
		if in.GetStatus() == clusterv1.Instance_STATUS_RUNNING {
			ready++
		}
	}
	status, err := anypb.New(&clusterv1.DeploymentStatus{DeploymentId: deploymentID, DesiredReplicas: int32(len(instances)), ReadyReplicas: ready,
		AvailableReplicas: ready, Instances: instances})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Client.ReportStatus(context.Background(), &clusterv1.ReportStatusRequest{
		Kind: kinds.Deployment, Id: deploymentID, Status: status, ObservedVersion: v, ObservedAt: timestamppb.Now(),
	})
	if err != nil {
		t.Fatalf("cluster %s: report on %s: %v", c.ID, deploymentID, err)
	}
}

// ReportRunning reports n running instances named <k8s name>-<i>.
func (c *FakeCluster) ReportRunning(t testing.TB, deploymentID string, n int) {
	t.Helper()
	var ins []*clusterv1.Instance
	for i := range n {
		ins = append(ins, Running(fmt.Sprintf("%s-%s-%d", K8sName(deploymentID), c.Region, i)))
	}
	c.Report(t, deploymentID, ins...)
}

// ReportApplyError reports that the cluster cannot apply the deployment's
// current version.
func (c *FakeCluster) ReportApplyError(t testing.TB, deploymentID, field, message string, permanent bool) uint64 {
	t.Helper()
	v, _ := c.Version(t, deploymentID)
	_, err := c.Client.ReportStatus(context.Background(), &clusterv1.ReportStatusRequest{
		Kind: "deployment", Id: deploymentID, ObservedVersion: v, ObservedAt: timestamppb.Now(),
		ApplyError: &clusterv1.ApplyError{Version: v, Message: message, Field: field, Permanent: permanent},
	})
	if err != nil {
		t.Fatalf("cluster %s: report apply error on %s: %v", c.ID, deploymentID, err)
	}
	return v
}

// K8sName is the workload name of a deployment id ("dep_x" -> "dep-x").
func K8sName(id string) string {
	out := []byte(id)
	for i, b := range out {
		if b == '_' {
			out[i] = '-'
		}
	}
	return string(out)
}

// Running, Pending and Failed are instances in those states.
func Running(name string) *clusterv1.Instance {
	return &clusterv1.Instance{K8SName: name, Address: name + ":8080", Status: clusterv1.Instance_STATUS_RUNNING}
}

func Pending(name, reason string) *clusterv1.Instance {
	return &clusterv1.Instance{K8SName: name, Status: clusterv1.Instance_STATUS_PENDING, Reason: reason}
}

func Failed(name, reason, message string) *clusterv1.Instance {
	return &clusterv1.Instance{K8SName: name, Status: clusterv1.Instance_STATUS_FAILED, Reason: reason, Message: message}
}

// WaitStatus polls GetDeployment until the deployment is in one of want,
// and returns it with every distinct status seen on the way (in order).
func WaitStatus(t testing.TB, api ctrlv1.DeploymentServiceClient, id string, timeout time.Duration, want ...ctrlv1.DeploymentStatus) (*ctrlv1.DeploymentInfo, []ctrlv1.DeploymentStatus) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []ctrlv1.DeploymentStatus
	for {
		d, err := api.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		if err != nil {
			t.Fatalf("GetDeployment %s: %v", id, err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != d.GetStatus() {
			seen = append(seen, d.GetStatus())
		}
		if slices.Contains(want, d.GetStatus()) {
			return d, seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("deployment %s: status %s after %s (error %q), want one of %v; seen %v", id, d.GetStatus(), timeout, d.GetError(), want, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
