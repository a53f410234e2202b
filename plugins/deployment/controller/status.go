package controller

import (
	"cmp"
	"net"
	"slices"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
)

// newFeed is the plugin's WatchStatus: one DeploymentStatus per
// deployment, built from the ReplicaSet and pod caches. Informer events
// only say a deployment changed; every statusTick the changed ones are
// rebuilt and sent when they differ from what the stream sent last, so a
// burst of pod events is one report, and every status_resync_interval
// everything is sent again, so a report lost upstream heals.
func (c *Controller) newFeed() *sdk.StatusFeed {
	return sdk.NewStatusFeed(sdk.FeedOptions{
		Kind: kinds.Deployment, Tick: statusTick, Observe: c.observe, Resend: Defaults().resync,
		IDs: func() []string {
			if _, k := c.state(); k != nil {
				return c.knownIDs(k)
			}
			return nil
		},
	})
}

// observe is one deployment's status as the caches have it.
func (c *Controller) observe(id string) sdk.Observation {
	_, k := c.state()
	if k == nil {
		return sdk.Observation{Gone: true, Status: &clusterv1.DeploymentStatus{DeploymentId: id, Deleted: true}}
	}
	st, ver := c.deploymentStatus(k, id)
	return sdk.Observation{Status: st, Version: ver, Gone: st.GetDeleted()}
}

// knownIDs lists every deployment with a ReplicaSet or a pod in the caches.
func (c *Controller) knownIDs(k *kubeState) []string {
	var ids []string
	rss, _ := k.replicaSets.List(labels.Everything())
	for _, rs := range rss {
		ids = append(ids, rs.Labels[LabelDeployment])
	}
	pods, _ := k.pods.List(labels.Everything())
	for _, p := range pods {
		ids = append(ids, p.Labels[LabelDeployment])
	}
	return slices.DeleteFunc(ids, func(id string) bool { return id == "" })
}

// deploymentStatus builds one deployment's status from the caches and
// returns the version its current ReplicaSet was applied at.
func (c *Controller) deploymentStatus(k *kubeState, id string) (*clusterv1.DeploymentStatus, uint64) {
	rss, _ := ofDeployment[*appsv1.ReplicaSet](k.replicaSetIndex, id)
	pods, _ := ofDeployment[*corev1.Pod](k.podIndex, id)
	st := &clusterv1.DeploymentStatus{DeploymentId: id, Deleted: len(rss) == 0 && len(pods) == 0}
	var ver uint64
	cur := currentReplicaSet(rss)
	if cur == nil || cur.DeletionTimestamp != nil {
		// Being deleted: the delete's version, which no annotation carries.
		ver, _ = c.DeletedVersion(id)
	}
	if cur != nil {
		st.K8SName = k8sNameOf(cur)
		ver = max(ver, kube.AppliedVersion(cur.Annotations))
		if cur.DeletionTimestamp == nil && cur.Spec.Replicas != nil {
			st.DesiredReplicas = *cur.Spec.Replicas
			st.ReadyReplicas = cur.Status.ReadyReplicas
			st.AvailableReplicas = cur.Status.AvailableReplicas
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return cmp.Compare(a.Name, b.Name) })
	for _, p := range pods {
		st.Instances = append(st.Instances, instanceOf(p, c.zoneOf(k, p.Spec.NodeName)))
	}
	return st, ver
}

// currentReplicaSet is the one applied last: not being deleted, newest
// version, and among those of one version (a roll after a config change)
// the one created last.
func currentReplicaSet(rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	var best *appsv1.ReplicaSet
	rank := func(rs *appsv1.ReplicaSet) (bool, uint64) {
		return rs.DeletionTimestamp == nil, kube.AppliedVersion(rs.Annotations)
	}
	for _, rs := range rss {
		if best == nil {
			best = rs
			continue
		}
		alive, v := rank(rs)
		bestAlive, bestV := rank(best)
		newer := rs.CreationTimestamp.After(best.CreationTimestamp.Time)
		if alive && !bestAlive || alive == bestAlive && (v > bestV || v == bestV && newer) {
			best = rs
		}
	}
	return best
}

func (c *Controller) zoneOf(k *kubeState, node string) string {
	if node == "" {
		return ""
	}
	obj, err := k.nodes.Get(node)
	if err != nil {
		return ""
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetLabels()[zoneKey]
}

// Container waiting reasons that mean the instance cannot start without a
// change (of the image, the spec, or the code).
var failedReasons = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
	"CrashLoopBackOff": true, "CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

const maxMessage = 1024

// instanceOf maps a pod to an instance. It is pure, so every state is
// unit-tested.
func instanceOf(p *corev1.Pod, zone string) *clusterv1.Instance {
	in := &clusterv1.Instance{K8SName: p.Name, Zone: zone}
	if !p.CreationTimestamp.IsZero() {
		in.CreatedAt = timestamppb.New(p.CreationTimestamp.Time) // ctrl measures startup from it
	}
	port := int32(defaultPort)
	for _, c := range p.Spec.Containers {
		if c.Name != containerName {
			continue
		}
		in.CpuMillicores = c.Resources.Limits.Cpu().MilliValue()
		in.MemoryMib = c.Resources.Limits.Memory().Value() / (1024 * 1024)
		if len(c.Ports) > 0 {
			port = c.Ports[0].ContainerPort
		}
	}
	if p.Status.PodIP != "" {
		in.Address = net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))
	}
	in.Status, in.Reason, in.Message = podState(p)
	if len(in.Message) > maxMessage {
		in.Message = in.Message[:maxMessage]
	}
	return in
}

func podState(p *corev1.Pod) (clusterv1.Instance_Status, string, string) {
	const (
		pending = clusterv1.Instance_STATUS_PENDING
		running = clusterv1.Instance_STATUS_RUNNING
		failed  = clusterv1.Instance_STATUS_FAILED
	)
	// A terminating pod still runs, but must not get new traffic.
	if p.DeletionTimestamp != nil {
		return pending, "Terminating", "the instance is shutting down"
	}
	switch p.Status.Phase {
	case corev1.PodFailed:
		return failed, cmp.Or(p.Status.Reason, "Failed"), cmp.Or(p.Status.Message, "the pod failed and is not restarted")
	case corev1.PodSucceeded:
		return failed, "Completed", "the container exited; a deployment is expected to keep running"
	}
	var waiting *corev1.ContainerStateWaiting
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		if failedReasons[w.Reason] {
			msg := w.Message
			// For a crash loop, the crash itself says more than "back-off".
			if t := cs.LastTerminationState.Terminated; w.Reason == "CrashLoopBackOff" && t != nil && t.Message != "" {
				msg = t.Message
			}
			return failed, w.Reason, msg
		}
		if waiting == nil {
			waiting = w
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			return pending, cmp.Or(cond.Reason, "Unschedulable"), cond.Message
		}
	}
	if p.Status.Phase == corev1.PodRunning && podReady(p) {
		return running, "", ""
	}
	if waiting != nil {
		return pending, waiting.Reason, waiting.Message
	}
	if p.Status.Phase == corev1.PodRunning {
		return pending, "NotReady", "the readiness probe has not passed yet"
	}
	return pending, cmp.Or(string(p.Status.Phase), "Pending"), p.Status.Message
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
