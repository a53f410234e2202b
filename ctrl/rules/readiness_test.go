package rules_test

import (
	"testing"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
)

// region is a region at version 1 whose one counted cluster, <name>-1,
// reported version 1 with instances.
func region(name string, desired int32, instances ...store.Instance) store.RegionState {
	cluster := name + "-1"
	for i := range instances {
		instances[i].ClusterID = cluster
	}
	r := store.RegionState{Region: name, DesiredReplicas: desired, DesiredStatus: "running", Instances: instances, Version: 1,
		Actual: actual.Region{Version: 1, Counted: []string{cluster}, Reports: []actual.Report{{ClusterID: cluster, Version: 1}}}}
	for _, in := range instances {
		switch in.Status {
		case "running":
			r.Running++
		case "pending":
			r.Pending++
		case "failed":
			r.Failed++
		}
	}
	return r
}

func pod(name, status, reason, msg string) store.Instance {
	return store.Instance{K8sName: name, Status: status, Reason: reason, Message: msg}
}

func TestEvaluate(t *testing.T) {
	stopped := region("ap", 2)
	stopped.DesiredStatus = "stopped"
	withApplyErr := region("us", 1)
	withApplyErr.ApplyErrors = []store.ApplyError{{ClusterID: "us-1", Version: 42, Field: "image", Message: "not a valid reference", Permanent: true}}
	retrying := region("us", 1)
	retrying.ApplyErrors = []store.ApplyError{{ClusterID: "us-1", Version: 7, Message: "apiserver unreachable"}}
	// Two clusters in eu: eu-2 is gone (not counted), its failed pod and
	// its silence decide nothing.
	goneCluster := region("eu", 1, pod("a", "running", "", ""))
	goneCluster.Instances = append(goneCluster.Instances, store.Instance{ClusterID: "eu-2", K8sName: "x", Status: "failed", Reason: "Evicted"})
	goneCluster.Actual.Ignored = []actual.Report{{ClusterID: "eu-2", Version: 1}}
	// Two counted clusters: eu-2 has not reported the current version.
	twoCounted := region("eu", 1, pod("a", "running", "", ""))
	twoCounted.Version, twoCounted.Actual.Version = 2, 2
	twoCounted.Actual.Reports[0].Version = 2
	twoCounted.Instances = append(twoCounted.Instances, store.Instance{ClusterID: "eu-2", K8sName: "b", Status: "running"})
	twoCounted.Actual.Counted = []string{"eu-1", "eu-2"}
	twoCounted.Actual.Reports = append(twoCounted.Actual.Reports, actual.Report{ClusterID: "eu-2", Version: 1})
	noneLive := region("eu", 1, pod("a", "running", "", ""))
	noneLive.Actual.Counted, noneLive.Actual.Reports = nil, nil
	many := region("eu", 5, pod("a", "failed", "CrashLoopBackOff", ""), pod("b", "failed", "CrashLoopBackOff", ""),
		pod("c", "failed", "CrashLoopBackOff", ""), pod("d", "failed", "OOMKilled", ""))
	for _, c := range []struct {
		name    string
		regions []store.RegionState
		result  string
		message string
	}{
		{"every region running", []store.RegionState{region("eu", 2, pod("a", "running", "", ""), pod("b", "running", "", "")),
			region("us", 1, pod("c", "running", "", ""))}, rules.ResultReady, ""},
		{"more running than desired is ready", []store.RegionState{region("eu", 1, pod("a", "running", "", ""), pod("b", "running", "", ""))},
			rules.ResultReady, ""},
		{"a stopped region does not count", []store.RegionState{region("eu", 1, pod("a", "running", "", "")), stopped}, rules.ResultReady, ""},
		{"one region short", []store.RegionState{region("eu", 2, pod("a", "running", "", ""), pod("b", "pending", "ContainerCreating", "")),
			region("us", 1)}, "", "region eu: 1/2 running (pod b ContainerCreating); region us: 0/1 running (no instance reported yet)"},
		{"failed pod", []store.RegionState{region("eu", 2, pod("web-0", "failed", "ImagePullBackOff", "Back-off pulling image \"x\""), pod("web-1", "running", "", ""))},
			rules.ResultFailed, "region eu: 1/2 running: pod web-0 ImagePullBackOff: Back-off pulling image \"x\""},
		{"many failed pods are summarised", []store.RegionState{many}, rules.ResultFailed,
			"region eu: 0/5 running: pod a CrashLoopBackOff, pod b CrashLoopBackOff, pod c CrashLoopBackOff and 1 more"},
		{"permanent apply error", []store.RegionState{region("eu", 1, pod("a", "running", "", "")), withApplyErr}, rules.ResultFailed,
			"region us: image: not a valid reference (cluster us-1 could not apply version 42)"},
		{"retryable apply error waits", []store.RegionState{retrying}, "",
			"region us: 0/1 running (no instance reported yet; retrying: apiserver unreachable (cluster us-1 could not apply version 7))"},
		{"no topology", nil, "", "no region is set to run the deployment"},
		{"a cluster that does not count holds nothing back", []store.RegionState{goneCluster}, rules.ResultReady, ""},
		{"every counted cluster must report the current version", []store.RegionState{twoCounted}, "",
			"region eu, cluster eu-2: 1/1 running (version 2 not reported yet)"},
		{"no live cluster", []store.RegionState{noneLive}, "",
			"region eu: no live cluster serves deployments (a cluster counts while its last heartbeat is at most 2m0s old)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := rules.Evaluate(c.regions)
			if o.Result != c.result || o.Message != c.message {
				t.Fatalf("Evaluate = %+v\nwant result %q message %q", o, c.result, c.message)
			}
		})
	}
}
