package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
	"krane.dev/shared/version"
)

// Name is the controller's name in krane.hcl.
const Name = "sentinel"

var (
	deploymentsGVR     = appsv1.SchemeGroupVersion.WithResource("deployments")
	servicesGVR        = corev1.SchemeGroupVersion.WithResource("services")
	pdbsGVR            = policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets")
	configMapsGVR      = corev1.SchemeGroupVersion.WithResource("configmaps")
	serviceAccountsGVR = corev1.SchemeGroupVersion.WithResource("serviceaccounts")
	namespacesGVR      = corev1.SchemeGroupVersion.WithResource("namespaces")
)

// Option adjusts a Controller (tests and embedding hosts).
type Option func(*options)

type options struct {
	restHooks         []func(*rest.Config)
	discoveryInterval time.Duration
	statusTick        time.Duration
}

// WithCallCounter counts every API call the controller makes.
func WithCallCounter(cc *kube.CallCounter) Option {
	return func(o *options) { o.restHooks = append(o.restHooks, cc.Wrap) }
}

// WithDiscoveryInterval sets how often discovery is asked whether the
// CiliumNetworkPolicy CRD is served (default 10s).
func WithDiscoveryInterval(d time.Duration) Option {
	return func(o *options) { o.discoveryInterval = d }
}

// Controller reconciles sentinels: per sentinel a Deployment, a ClusterIP
// Service, a PodDisruptionBudget, a headless gossip Service and a gossip
// CiliumNetworkPolicy, and reports each sentinel's rollout and health.
//
// Its embedded StatusFeed is its WatchStatus.
type Controller struct {
	*sdk.StatusFeed
	log  hclog.Logger
	opts options

	// repair re-applies a sentinel whose objects someone else changed or
	// deleted at once, from ctrl's desired state (sdk/kube.Repairer),
	// instead of at the host's next resync.
	repair *kube.Repairer
	stop   context.CancelFunc

	mu sync.RWMutex
	cl *cluster
}

// New returns an unconfigured controller.
func New(log hclog.Logger, opts ...Option) *Controller {
	o := options{discoveryInterval: 10 * time.Second, statusTick: 200 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	c := &Controller{log: log, opts: o}
	c.StatusFeed = c.newFeed()
	// A repair holds the Repairer's lock of the id, as Apply does.
	c.repair = kube.NewRepairer(kinds.Sentinel, log, func(ctx context.Context, ch sdk.Change) error {
		_, err := c.apply(ctx, ch)
		return err
	})
	var bg context.Context
	bg, c.stop = context.WithCancel(context.Background())
	go c.repair.Run(bg)
	return c
}

// permissions are what the plugin's identity needs (rbac.yaml grants
// them): the objects of every sentinel in namespace ns (with its
// credentials Secret), the ReplicaSets and pods its status comes from, and
// ns itself.
func permissions(ns, serviceAccount string) []sdk.Permission {
	objects := []string{"list", "watch", "create", "patch", "delete"}
	return []sdk.Permission{
		{Group: "apps", Resource: "deployments", Verbs: objects, Namespace: ns},
		{Resource: "services", Verbs: objects, Namespace: ns},
		{Group: "policy", Resource: "poddisruptionbudgets", Verbs: objects, Namespace: ns},
		{Resource: "configmaps", Verbs: objects, Namespace: ns},
		{Group: "cilium.io", Resource: "ciliumnetworkpolicies", Verbs: objects, Namespace: ns},
		{Resource: "secrets", Verbs: objects, Namespace: ns},
		{Group: "apps", Resource: "replicasets", Verbs: []string{"list", "watch"}, Namespace: ns},
		{Resource: "pods", Verbs: []string{"list", "watch"}, Namespace: ns},
		{Resource: "namespaces", Verbs: []string{"create"}},
		{Resource: "namespaces", Verbs: []string{"list", "watch", "patch"}, Name: ns},
		// The account sentinel pods run as, created on demand like the
		// namespace (its rights come from the manifests, pods.yaml).
		{Resource: "serviceaccounts", Verbs: []string{"create"}, Namespace: ns},
		{Resource: "serviceaccounts", Verbs: []string{"list", "watch", "patch"}, Namespace: ns, Name: serviceAccount},
	}
}

func (c *Controller) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name:    Name,
		Version: version.Version,
		Kinds: []sdk.KindInfo{{
			Kind:        kinds.Sentinel,
			Description: "an environment's routing proxy: Deployment, Service, PodDisruptionBudget, gossip Service and CiliumNetworkPolicy, and a Secret with its credentials",
			SpecType:    string((&clusterv1.Sentinel{}).ProtoReflect().Descriptor().FullName()),
		}},
		ConfigSchema: ConfigSchema,
		Permissions:  permissions(DefaultNamespace, DefaultServiceAccount),
	}}, nil
}

func (c *Controller) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	s, err := parseConfig(req.Config)
	if err != nil {
		return nil, err
	}
	clients, err := kube.Connect(ctx, req.Kube, permissions(s.Namespace, s.ServiceAccount), c.opts.restHooks...)
	if err != nil {
		return nil, err
	}
	c.repair.SetHost(req.Host)
	cl, err := startCluster(ctx, clusterDeps{
		clients:           clients,
		host:              req.Host,
		repair:            c.repair,
		params:            params{settings: s, Region: req.Region},
		log:               c.log,
		feed:              c.StatusFeed,
		discoveryInterval: c.opts.discoveryInterval,
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	old := c.cl
	c.cl = cl
	c.mu.Unlock()
	if old != nil {
		old.close()
	}
	c.SetResend(cl.p.StatusResyncInterval)
	c.ChangedAll()
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID, "namespace", s.Namespace,
		"require_sentinel_nodes", s.RequireSentinelNodes, "env_from_secrets", len(s.EnvFromSecrets),
		"policy_crd_served", cl.policies.Load() != nil)
	return &sdk.ConfigureResponse{}, nil
}

func (c *Controller) current() *cluster {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cl
}

// Apply applies one change under the id's repair lock and records it for
// repairs (kube.Repairer.Apply).
func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return c.repair.Apply(ctx, req, c.apply)
}

func (c *Controller) apply(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	cl := c.current()
	if cl == nil {
		return 0, fmt.Errorf("apply sentinel %s: the plugin is not configured yet", ch.ID)
	}
	if ch.Kind != kinds.Sentinel {
		return 0, sdk.InvalidField("kind", "this plugin reconciles %q, not %q", kinds.Sentinel, ch.Kind)
	}
	if err := labelValue("id", ch.ID); err != nil {
		return 0, err
	}
	if ch.Deleted {
		c.Deleted(ch.ID, ch.Version)
		if err := cl.deleteSentinel(ctx, ch.ID, ""); err != nil {
			return 0, err
		}
		return sdk.Deleted, nil
	}
	var s clusterv1.Sentinel
	if err := ch.Spec.Decode(&s); err != nil {
		return 0, err
	}
	if err := validate(ch.ID, &s); err != nil {
		return 0, err
	}
	wrote, err := cl.apply(ctx, &s, ch.Version)
	if err != nil {
		return 0, err
	}
	if wrote {
		return sdk.Applied, nil
	}
	return sdk.Unchanged, nil
}

// apply makes the cluster hold the sentinel's objects, writing only those
// that drifted from the desired state according to the caches. It reports
// whether anything was written.
func (cl *cluster) apply(ctx context.Context, s *clusterv1.Sentinel, version uint64) (bool, error) {
	ns, name := cl.p.Namespace, s.GetK8SName()
	wrote := false
	if err := cl.ensureNamespace(ctx, &wrote); err != nil {
		return false, err
	}

	// The Deployment first: the others name it as their owner.
	live := cached[*appsv1.Deployment](cl.deployments, ns, name)
	if live != nil && live.Labels[LabelSentinel] != s.GetId() {
		return false, sdk.InvalidField("k8s_name", "Deployment %s/%s already belongs to sentinel %q; pick another k8s_name or delete that sentinel first", ns, name, live.Labels[LabelSentinel])
	}
	var uid types.UID
	if live != nil {
		uid = live.UID
	}
	// The credentials Secret before the Deployment whose template names
	// its hash (credentials.go), owned by the Deployment once it exists.
	var creds *credentialsWriter
	if len(s.GetEncryptedCredentials()) > 0 {
		creds = &credentialsWriter{cl: cl, s: s}
		defer creds.close()
		var early *metav1.OwnerReference
		if uid != "" {
			early = ownerRefFromUID(name, uid)
		}
		w, err := creds.ensure(ctx, early)
		if err != nil {
			return false, err
		}
		wrote = wrote || w
	}
	written, err := cl.applyIfDrifted(ctx, deploymentsGVR, buildDeployment(s, version, cl.p), liveObject(live))
	if err != nil {
		return false, err
	}
	if written != nil {
		wrote, uid = true, written.GetUID()
	}
	owner := ownerRefFromUID(name, uid)
	if creds != nil {
		w, err := creds.ensure(ctx, owner)
		if err != nil {
			return false, err
		}
		wrote = wrote || w
	} else if len(cl.secretsOf(s.GetId())) > 0 {
		// No credentials (any more): the pods no longer name the Secret.
		if err := cl.deleteCredentials(ctx, s.GetId(), ""); err != nil {
			return wrote, err
		}
	}
	id := identityOf(s, version)
	routes, err := buildRoutes(s, version, cl.p, owner)
	if err != nil {
		return false, err
	}

	type object struct {
		gvr           schema.GroupVersionResource
		desired, live runtime.Object
	}
	objects := []object{
		{servicesGVR, buildService(s, version, cl.p, owner), liveObject(cached[*corev1.Service](cl.services, ns, name))},
		{pdbsGVR, buildPDB(s, version, cl.p, owner), liveObject(cached[*policyv1.PodDisruptionBudget](cl.pdbs, ns, name))},
		{servicesGVR, buildGossipService(id, cl.p, owner), liveObject(cached[*corev1.Service](cl.services, ns, gossipName(name)))},
		{configMapsGVR, routes, liveObject(cached[*corev1.ConfigMap](cl.routes, ns, routesName(name)))},
	}
	// Without the CRD the policy waits: watchPolicyCRD applies it when the
	// CRD appears, and the status says why it is missing meanwhile.
	if pc := cl.policies.Load(); pc != nil {
		policy, err := buildGossipPolicy(id, cl.p, owner)
		if err != nil {
			return false, err
		}
		objects = append(objects, object{PolicyGVR, policy, pc.live(ns, gossipName(name))})
	}
	for _, o := range objects {
		written, err := cl.applyIfDrifted(ctx, o.gvr, o.desired, o.live)
		if err != nil {
			return false, err
		}
		if written != nil {
			wrote = true
		}
	}

	// A sentinel renamed in ctrl leaves its objects under the old name: remove
	// them once the new ones are in place.
	if err := cl.deleteSentinel(ctx, s.GetId(), name); err != nil {
		return wrote, err
	}
	return wrote, nil
}

// liveObject turns a typed nil pointer into a nil interface.
func liveObject[T runtime.Object](obj T) runtime.Object {
	if any(obj) == any(*new(T)) {
		return nil
	}
	return obj
}

// applyIfDrifted server-side applies desired unless live (from a cache)
// already matches it. It returns the written object, or nil when nothing
// was written.
func (cl *cluster) applyIfDrifted(ctx context.Context, gvr schema.GroupVersionResource, desired runtime.Object, live runtime.Object) (*unstructured.Unstructured, error) {
	u, ok := desired.(*unstructured.Unstructured)
	if !ok {
		var err error
		if u, err = kube.ToUnstructured(desired); err != nil {
			return nil, fmt.Errorf("convert %s %s: %w", gvr.Resource, nameOf(desired), err)
		}
	}
	if live != nil {
		var where string
		if lu, ok := live.(*unstructured.Unstructured); ok {
			where = kube.Drift(u.Object, lu.Object)
		} else {
			var err error
			if where, err = kube.DriftObject(u.Object, live); err != nil {
				return nil, err
			}
		}
		if where == "" {
			return nil, nil
		}
		cl.log.Debug("object differs from desired state; applying", "kind", u.GetKind(), "object", u.GetNamespace()+"/"+u.GetName(), "at", where)
	}
	out, err := kube.Apply(ctx, cl.dyn, gvr, u)
	if err != nil && live != nil && apierrors.IsInvalid(err) {
		// A hand edit can leave list entries owned by another field
		// manager, e.g. a Service port renumbered with kubectl edit: apply
		// merges ours next to them and the result is invalid (two ports
		// named "http"). Replace the lists wholesale with a JSON merge
		// patch, then apply again so that krane owns the fields.
		cl.log.Info("apply refused after an edit by another field manager; replacing its lists with a merge patch",
			"kind", u.GetKind(), "object", u.GetNamespace()+"/"+u.GetName(), "error", err)
		if perr := cl.mergePatch(ctx, gvr, u); perr == nil {
			out, err = kube.Apply(ctx, cl.dyn, gvr, u)
		}
	}
	if err != nil {
		return nil, classify(err)
	}
	cl.repair.Wrote(out)
	return out, nil
}

func (cl *cluster) mergePatch(ctx context.Context, gvr schema.GroupVersionResource, u *unstructured.Unstructured) error {
	data, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	_, err = cl.dyn.Resource(gvr).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, data, metav1.PatchOptions{FieldManager: kube.FieldManager})
	return err
}

// classify marks the API server's refusals that a retry cannot fix.
func classify(err error) error {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return sdk.Permanent(err)
	case apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "being terminated"):
		return fmt.Errorf("%w (does the plugin's identity have the ClusterRole of its rbac.yaml?)", err)
	}
	return err
}

func nameOf(obj runtime.Object) string {
	if m, ok := obj.(metav1.Object); ok {
		return m.GetNamespace() + "/" + m.GetName()
	}
	return "?"
}

// ensureNamespace creates or labels the namespace when the cache says it is
// missing or differs.
func (cl *cluster) ensureNamespace(ctx context.Context, wrote *bool) error {
	live := cached[*corev1.Namespace](cl.namespaces, "", cl.p.Namespace)
	if live != nil && live.DeletionTimestamp != nil {
		return fmt.Errorf("namespace %q is being deleted; sentinels are created again once it is gone", cl.p.Namespace)
	}
	written, err := cl.applyIfDrifted(ctx, namespacesGVR, buildNamespace(cl.p.Namespace), liveObject(live))
	if err != nil {
		return err
	}
	if written != nil {
		*wrote = true
	}
	// The pods' account: without it the ReplicaSet cannot create a pod.
	sa := cached[*corev1.ServiceAccount](cl.serviceAccounts, cl.p.Namespace, cl.p.ServiceAccount)
	if written, err = cl.applyIfDrifted(ctx, serviceAccountsGVR, buildServiceAccount(cl.p), liveObject(sa)); err != nil {
		return err
	}
	if written != nil {
		*wrote = true
	}
	return nil
}

// deleteSentinel deletes the objects of sentinel id, except those of the
// Deployment named keep (empty: delete all). It lists from the API server,
// not the caches, so that objects created moments ago are not missed. The
// Deployment goes last: until then Inventory still lists the sentinel, and
// its ownerReferences make the garbage collector remove any dependent a
// crash left behind.
func (cl *cluster) deleteSentinel(ctx context.Context, id, keep string) error {
	if keep != "" && !cl.hasStale(id, keep) {
		return nil // the common case: nothing to list
	}
	ns := cl.p.Namespace
	opts := metav1.ListOptions{LabelSelector: kube.ManagedSelector(Component) + "," + LabelSentinel + "=" + id}
	kept := func(name string) bool {
		return keep != "" && (name == keep || name == gossipName(keep) || name == routesName(keep))
	}
	keepCredentials := ""
	if keep != "" {
		keepCredentials = credentialsName(keep)
	}
	var errs []error
	del := func(gvr schema.GroupVersionResource) {
		res := cl.dyn.Resource(gvr).Namespace(ns)
		list, err := res.List(ctx, opts)
		if apierrors.IsNotFound(err) {
			return // the CRD is not served: there is nothing to delete
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s of sentinel %s: %w", gvr.Resource, id, err))
			return
		}
		for _, obj := range list.Items {
			if kept(obj.GetName()) {
				continue
			}
			uid := obj.GetUID()
			cl.repair.Deleting(uid)
			err := res.Delete(ctx, obj.GetName(), metav1.DeleteOptions{
				Preconditions:     &metav1.Preconditions{UID: &uid},
				PropagationPolicy: ptr(metav1.DeletePropagationBackground),
			})
			// NotFound: already gone. Conflict: replaced by a newer object
			// with another UID, which is not ours to delete.
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("delete %s %s/%s: %w", obj.GetKind(), ns, obj.GetName(), err))
			}
		}
	}
	if cl.policies.Load() != nil {
		del(PolicyGVR)
	}
	del(servicesGVR)
	del(pdbsGVR)
	del(configMapsGVR)
	if err := cl.deleteCredentials(ctx, id, keepCredentials); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		del(deploymentsGVR)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete sentinel %s: %w", id, err)
	}
	return nil
}

// hasStale reports whether the caches hold an object of sentinel id not
// named after the Deployment keep.
func (cl *cluster) hasStale(id, keep string) bool {
	stale := func(name string) bool { return name != keep && name != gossipName(keep) && name != routesName(keep) }
	for _, s := range cl.secretsOf(id) {
		if s.Name != credentialsName(keep) {
			return true
		}
	}
	for _, d := range cl.deploymentsOf(id) {
		if stale(d.Name) {
			return true
		}
	}
	for _, s := range cl.servicesOf(id) {
		if stale(s.Name) {
			return true
		}
	}
	for _, p := range cl.pdbsOf(id) {
		if stale(p.Name) {
			return true
		}
	}
	for _, r := range cl.routesOf(id) {
		if stale(r.Name) {
			return true
		}
	}
	for _, p := range cl.policiesOf(id) {
		if stale(p.GetName()) {
			return true
		}
	}
	return false
}

func (c *Controller) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	cl := c.current()
	if req.Kind != kinds.Sentinel || cl == nil {
		return &sdk.InventoryResponse{}, nil
	}
	return kube.Inventory(kinds.Sentinel, LabelSentinel, cl.allDeployments()), nil
}

func (c *Controller) Shutdown(ctx context.Context) error {
	c.stop()
	c.mu.Lock()
	cl := c.cl
	c.cl = nil
	c.mu.Unlock()
	if cl == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { cl.close(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("informers did not stop before the deadline: %w", ctx.Err())
	}
}
