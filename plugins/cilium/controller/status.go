package controller

import (
	"sync"
	"time"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
)

// statusTick is how often pending status changes are sent: every change
// within one tick collapses into one report per policy.
const statusTick = 200 * time.Millisecond

// failures keeps what the cluster cannot tell: the last failed apply of
// each policy (the API server keeps no trace of a rejected write).
// Everything else is read from the informer when a report is built.
type failures struct {
	mu sync.Mutex
	m  map[string]failure
}

type failure struct {
	version uint64
	message string
}

func (f *failures) set(id string, version uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]failure{}
	}
	f.m[id] = failure{version: version, message: err.Error()}
}

func (f *failures) clear(id string) {
	f.mu.Lock()
	delete(f.m, id)
	f.mu.Unlock()
}

func (f *failures) get(id string) (failure, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[id]
	return v, ok
}

func (c *Controller) newFeed() *sdk.StatusFeed {
	return sdk.NewStatusFeed(sdk.FeedOptions{
		Kind: kinds.CiliumNetworkPolicy, Tick: statusTick, Observe: c.observe,
		IDs: func() []string { return c.cluster().ids() },
	})
}

// observe is one policy's krane.cluster.v1.CiliumNetworkPolicyStatus:
// rejected (its last apply failed: the message says why, e.g. the API
// server's answer), applied (in the cluster, its last apply succeeded), or
// deleted.
func (c *Controller) observe(id string) sdk.Observation {
	st := &clusterv1.CiliumNetworkPolicyStatus{Id: id}
	if f, failed := c.failures.get(id); failed {
		st.Message = f.message
		return sdk.Observation{Status: st, Version: f.version}
	}
	if objs := c.cluster().byID(id); len(objs) > 0 {
		st.Applied = true
		return sdk.Observation{Status: st, Version: kube.AppliedVersion(objs[0].GetAnnotations())}
	}
	st.Deleted = true
	return sdk.Observation{Status: st, Gone: true}
}
