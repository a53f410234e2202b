package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
)

// revisionAnnotation is where the deployment controller records a
// Deployment's and its ReplicaSets' revision.
const revisionAnnotation = "deployment.kubernetes.io/revision"

// unsettledRecheck is how often a sentinel that is neither healthy nor
// paused is evaluated again without an event: pod availability depends on
// time (minReadySeconds), not only on events.
const unsettledRecheck = time.Second

// newFeed is the plugin's WatchStatus: one report per sentinel whenever
// its status changes, coalescing bursts of events; every sentinel's status
// again each status_resync_interval, so a report lost on the way is never
// final; and a sentinel that is neither healthy nor paused evaluated again
// every unsettledRecheck, since availability depends on time as well as on
// events.
func (c *Controller) newFeed() *sdk.StatusFeed {
	return sdk.NewStatusFeed(sdk.FeedOptions{
		Kind: kinds.Sentinel, Tick: c.opts.statusTick, Observe: c.observe,
		IDs: func() []string {
			var ids []string
			for _, d := range c.current().allDeployments() {
				ids = append(ids, d.Labels[LabelSentinel])
			}
			return ids
		},
		Recheck: func(st proto.Message) bool {
			h := st.(*clusterv1.SentinelStatus).GetHealth()
			return h != clusterv1.Health_HEALTH_HEALTHY && h != clusterv1.Health_HEALTH_PAUSED
		},
		RecheckEvery: unsettledRecheck,
	})
}

// observe is one sentinel's status; a sentinel without a Deployment is
// gone.
func (c *Controller) observe(id string) sdk.Observation {
	if cl := c.current(); cl != nil {
		if st, version, ok := cl.observe(id, time.Now()); ok {
			return sdk.Observation{Status: st, Version: version}
		}
	}
	return sdk.Observation{Gone: true, Status: &clusterv1.SentinelStatus{SentinelId: id, Deleted: true,
		Health: clusterv1.Health_HEALTH_UNHEALTHY, Reason: "the sentinel's Deployment no longer exists"}}
}

// observe computes the status of sentinel id from the caches; ok is false
// when it has no Deployment.
func (cl *cluster) observe(id string, now time.Time) (st *clusterv1.SentinelStatus, version uint64, ok bool) {
	deps := cl.deploymentsOf(id)
	if len(deps) == 0 {
		return nil, 0, false
	}
	// Two Deployments exist only briefly while a renamed sentinel's old one
	// is deleted: report the newer.
	d := slices.MaxFunc(deps, func(a, b *appsv1.Deployment) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	o := observation{
		Deployment:    d,
		ReplicaSets:   cl.replicaSetsOf(id),
		Pods:          cl.podsOf(id),
		PolicyProblem: cl.policyProblem(d),
		Now:           now,
	}
	return sentinelStatus(o), kube.AppliedVersion(d.Annotations), true
}

// policyProblem says why the sentinel's gossip policy is not in place, or "".
func (cl *cluster) policyProblem(d *appsv1.Deployment) string {
	name := cl.p.Namespace + "/" + gossipName(d.Name)
	pc := cl.policies.Load()
	if pc == nil {
		return fmt.Sprintf("gossip CiliumNetworkPolicy %s not applied: the CiliumNetworkPolicy CRD (cilium.io/v2) is not installed in this cluster; it is applied once the CRD is served", name)
	}
	if _, exists, _ := pc.indexer.GetByKey(name); !exists {
		return fmt.Sprintf("gossip CiliumNetworkPolicy %s is missing; the next apply or resync creates it", name)
	}
	return ""
}

// observation is everything a sentinel's status is computed from.
type observation struct {
	Deployment  *appsv1.Deployment
	ReplicaSets []*appsv1.ReplicaSet // of this sentinel, any Deployment
	Pods        []*corev1.Pod        // of this sentinel, any ReplicaSet
	// PolicyProblem is why the gossip policy is missing, or "".
	PolicyProblem string
	Now           time.Time
}

// sentinelStatus is the pure status function. ctrl resolves a waiting
// SentinelService.Deploy when a report says HEALTHY and running_image equals
// the desired image, so running_image is set only once the rollout is
// complete: the deployment controller has observed the current generation
// (or the new generation keeps the current pod template), it and the pod
// cache agree that exactly the desired number of pods run the
// current template and are available, and no pod of an older revision is
// left running. The Deployment and pod caches are separate watches that may
// lag each other; requiring both to agree means neither lag can produce an
// early "healthy on the new image".
func sentinelStatus(o observation) *clusterv1.SentinelStatus {
	d := o.Deployment
	desired := int32(1)
	if d.Spec.Replicas != nil {
		desired = *d.Spec.Replicas
	}
	st := &clusterv1.SentinelStatus{
		SentinelId:         d.Labels[LabelSentinel],
		K8SName:            d.Name,
		DesiredReplicas:    desired,
		AvailableReplicas:  d.Status.AvailableReplicas,
		UpdatedReplicas:    d.Status.UpdatedReplicas,
		ReadyReplicas:      d.Status.ReadyReplicas,
		ObservedGeneration: d.Status.ObservedGeneration,
	}
	r := rollout(o, desired)
	if desired == 0 {
		st.Health = clusterv1.Health_HEALTH_PAUSED
		st.Reason = "scaled to zero replicas"
		if !r.complete {
			st.Reason += "; " + r.progress
		}
		return st
	}
	var problems []string
	if r.complete {
		st.RunningImage = r.image
	} else {
		problems = append(problems, r.progress)
	}
	if c := deploymentCondition(d, appsv1.DeploymentProgressing); c != nil && c.Reason == "ProgressDeadlineExceeded" {
		problems = append(problems, "rollout exceeded its progress deadline: "+c.Message)
	}
	problems = append(problems, podProblems(o.Pods)...)
	if o.PolicyProblem != "" {
		problems = append(problems, o.PolicyProblem)
	}
	if r.complete && d.Status.AvailableReplicas >= desired && len(problems) == 0 {
		st.Health = clusterv1.Health_HEALTH_HEALTHY
		return st
	}
	st.Health = clusterv1.Health_HEALTH_UNHEALTHY
	st.Reason = strings.Join(problems, "; ")
	return st
}

type rolloutState struct {
	complete bool
	image    string // the image of every current, available pod
	progress string // why not complete
}

func rollout(o observation, desired int32) rolloutState {
	d := o.Deployment
	current := currentReplicaSet(d, o.ReplicaSets)
	// A generation the deployment controller has not seen may hold a new
	// pod template, so its status says nothing about it yet. Unless the
	// template is the current ReplicaSet's: then only metadata or counts
	// changed (the API server bumps the generation of a Deployment on any
	// annotation change, e.g. a new krane.dev/version), and a version bump
	// must not flap the sentinel to unhealthy.
	if d.Status.ObservedGeneration < d.Generation && (current == nil || !sameTemplate(d, current)) {
		return rolloutState{progress: fmt.Sprintf("progressing: generation %d not yet observed by the deployment controller (observed %d)", d.Generation, d.Status.ObservedGeneration)}
	}
	if current == nil && desired > 0 {
		return rolloutState{progress: "progressing: the ReplicaSet of the current revision is not created yet"}
	}
	minReady := time.Duration(d.Spec.MinReadySeconds) * time.Second
	var updated, available, old int32
	images := map[string]bool{}
	for _, p := range o.Pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if current == nil || controllerUID(p.OwnerReferences) != current.UID {
			// A pod of an older revision, terminating or not, still serves
			// with the old template.
			old++
			continue
		}
		if p.DeletionTimestamp != nil {
			continue // a surplus pod of the current revision going away
		}
		updated++
		if podAvailable(p, minReady, o.Now) {
			available++
			images[containerImage(&p.Spec)] = true
		}
	}
	ds := d.Status
	complete := ds.UpdatedReplicas == desired && ds.AvailableReplicas == desired && ds.Replicas == desired &&
		ds.UnavailableReplicas == 0 && updated == desired && available == desired && old == 0
	if complete && desired > 0 {
		want := containerImage(&d.Spec.Template.Spec)
		complete = len(images) == 1 && images[want]
		if complete {
			return rolloutState{complete: true, image: want}
		}
	}
	if complete {
		return rolloutState{complete: true}
	}
	var progress string
	switch {
	case ds.UpdatedReplicas < desired || updated < desired || old > 0:
		// The smaller count: the Deployment status and the pod cache may lag
		// each other, and an overstated count reads like a finished rollout.
		progress = fmt.Sprintf("progressing: %d/%d updated, %d/%d available", min(ds.UpdatedReplicas, updated), desired, ds.AvailableReplicas, desired)
		if old > 0 {
			progress += fmt.Sprintf(", %d old pod(s) still running", old)
		}
	case ds.Replicas > desired || ds.AvailableReplicas > desired || updated > desired:
		progress = fmt.Sprintf("progressing: removing surplus pods (%d for %d desired)", max(ds.Replicas, updated), desired)
	default:
		progress = fmt.Sprintf("%d/%d available", min(ds.AvailableReplicas, available), desired)
	}
	return rolloutState{progress: progress}
}

// currentReplicaSet is the Deployment's ReplicaSet of its current revision,
// or nil when the cache does not hold it (yet).
func currentReplicaSet(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	rev := d.Annotations[revisionAnnotation]
	if rev == "" {
		return nil
	}
	for _, rs := range rss {
		if controllerUID(rs.OwnerReferences) == d.UID && rs.Annotations[revisionAnnotation] == rev {
			return rs
		}
	}
	return nil
}

// sameTemplate is the deployment controller's own test of whether rs runs
// d's pod template: equal but for the pod-template-hash label.
func sameTemplate(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	t := rs.Spec.Template.DeepCopy()
	delete(t.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	return apiequality.Semantic.DeepEqual(&d.Spec.Template, t)
}

func controllerUID(refs []metav1.OwnerReference) types.UID {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return r.UID
		}
	}
	return ""
}

// podAvailable is the deployment controller's rule: Ready for at least
// minReady.
func podAvailable(p *corev1.Pod, minReady time.Duration, now time.Time) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && (minReady == 0 || (!c.LastTransitionTime.IsZero() && c.LastTransitionTime.Add(minReady).Before(now)))
		}
	}
	return false
}

func containerImage(spec *corev1.PodSpec) string {
	for _, c := range spec.Containers {
		if c.Name == ContainerName {
			return c.Image
		}
	}
	return ""
}

func deploymentCondition(d *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == t {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// maxPodProblems bounds the reason text; the rest is counted.
const maxPodProblems = 3

// podProblems names pods that cannot run: crash loops, failed pulls, missing
// Secrets, no node to run on. Sorted by pod name so the reason is stable
// and an unchanged problem is not re-sent.
func podProblems(pods []*corev1.Pod) []string {
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var out []string
	more := 0
	add := func(s string) {
		if len(out) < maxPodProblems {
			out = append(out, s)
		} else {
			more++
		}
	}
	for _, p := range sorted {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if problem := podProblem(p); problem != "" {
			add(problem)
		}
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("and %d more pod(s) with problems", more))
	}
	return out
}

func podProblem(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		switch w.Reason {
		case "CrashLoopBackOff":
			return fmt.Sprintf("pod %s is crash-looping (container %s, %d restarts)", p.Name, cs.Name, cs.RestartCount)
		case "ImagePullBackOff", "ErrImagePull", "InvalidImageName":
			return fmt.Sprintf("pod %s cannot pull image %s (%s)", p.Name, cs.Image, w.Reason)
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return fmt.Sprintf("pod %s cannot start container %s (%s: %s)", p.Name, cs.Name, w.Reason, w.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return fmt.Sprintf("pod %s cannot be scheduled: %s", p.Name, c.Message)
		}
	}
	return ""
}
