package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
	"krane.dev/shared/version"
)

// Name is the controller's name in krane.hcl.
const Name = "deployment"

// Controller reconciles kind "deployment". Create it with New. Its
// embedded StatusFeed is its WatchStatus.
type Controller struct {
	*sdk.StatusFeed
	log     hclog.Logger
	counter *kube.CallCounter

	mu   sync.RWMutex
	cfg  Config
	kube *kubeState
	host sdk.Host

	// Secret environments (secrets.go).
	envCache envCache
	verified kube.VerifiedSecrets
	stats    secretCounters

	nsLocks    keyedMutex
	namespaces knownNamespaces
	// pulls is what is left to sync of the pull Secrets' copies
	// (pullsecrets.go).
	pulls          *pullQueue
	desired        desiredNamespaces
	pullLookalikes atomic.Int64
	// idLocks serialises the work on one deployment: the host's Applies
	// and the plugin's own (a roll that waited for its slot, finishing a
	// roll).
	idLocks keyedMutex
	rolls   *roller
	// repair re-applies a ReplicaSet someone else changed at once, from
	// ctrl's desired state (sdk/kube.Repairer).
	repair *kube.Repairer
	// bg lives as long as the controller: the roll loop and the rolls it
	// starts run in it.
	bg     context.Context
	stopBG context.CancelFunc
}

// kubeState is what one Configure built: clients and informer caches.
type kubeState struct {
	clients     *kube.Clients
	dynamic     dynamic.Interface
	metadata    metadata.Interface
	replicaSets appslisters.ReplicaSetLister
	pods        corelisters.PodLister
	secrets     corelisters.SecretLister
	namespaces  corelisters.NamespaceLister
	nodes       cache.GenericLister
	// The same ReplicaSet, pod and Secret caches, indexed by deployment id
	// (index.go).
	replicaSetIndex cache.Indexer
	podIndex        cache.Indexer
	secretIndex     cache.Indexer
	pdbIndex        cache.Indexer
	serviceIndex    cache.Indexer
	// pullSourceStores hold the configured pull Secrets of
	// pull_secret_namespace, one informer each, by name.
	pullSourceStores map[string]cache.Store
	copyKey          []byte // proves pull Secret copies (pulltargets.go)
	informers        *kube.Informers
}

// nodesGVR: nodes are cached as metadata only, for their zone label.
var nodesGVR = corev1.SchemeGroupVersion.WithResource("nodes")

func (k *kubeState) replicaSetClient(ns string) *kube.Client[*appsv1.ReplicaSet, *appsv1.ReplicaSetList] {
	return kube.Typed[appsv1.ReplicaSet, appsv1.ReplicaSetList](k.clients, "replicasets", ns)
}

func (k *kubeState) namespaceClient() *kube.Client[*corev1.Namespace, *corev1.NamespaceList] {
	return kube.Typed[corev1.Namespace, corev1.NamespaceList](k.clients, "namespaces", "")
}

// Option configures a Controller.
type Option func(*Controller)

// WithCallCounter counts every API call the controller makes (tests use it
// to prove that unchanged Applies write nothing; a host may export it).
func WithCallCounter(c *kube.CallCounter) Option { return func(ctl *Controller) { ctl.counter = c } }

// New returns an unconfigured controller.
func New(log hclog.Logger, opts ...Option) *Controller {
	c := &Controller{log: log, cfg: Defaults(), rolls: newRoller(), pulls: newPullQueue()}
	c.StatusFeed = c.newFeed()
	for _, o := range opts {
		o(c)
	}
	c.repair = kube.NewRepairer(kinds.Deployment, log, func(ctx context.Context, ch sdk.Change) error {
		_, err := c.applyLocked(ctx, ch)
		return err
	})
	c.bg, c.stopBG = context.WithCancel(context.Background())
	go c.progressRolls(c.bg)
	go c.repair.Run(c.bg)
	go c.syncPullSecrets(c.bg)
	return c
}

// Permissions are what the plugin's identity needs; rbac.yaml grants them
// and says why each is needed.
var Permissions = []sdk.Permission{
	{Group: "apps", Resource: "replicasets", Verbs: []string{"list", "watch", "create", "patch", "delete"}},
	{Resource: "namespaces", Verbs: []string{"get", "list", "watch", "create", "delete"}},
	{Resource: "pods", Verbs: []string{"list", "watch"}},
	{Resource: "nodes", Verbs: []string{"list", "watch"}},
	{Group: "node.k8s.io", Resource: "runtimeclasses", Verbs: []string{"get"}},
	{Resource: "secrets", Verbs: []string{"list", "watch", "create", "patch", "delete"}},
	{Group: "policy", Resource: "poddisruptionbudgets", Verbs: []string{"list", "watch", "create", "patch", "delete"}},
	{Resource: "services", Verbs: []string{"list", "watch", "create", "patch", "delete"}},
	{Resource: "configmaps", Verbs: []string{"list"}},
	{Resource: "serviceaccounts", Verbs: []string{"list"}},
	{Resource: "persistentvolumeclaims", Verbs: []string{"list"}},
	{Group: "apps", Resource: "deployments", Verbs: []string{"list"}},
	{Group: "apps", Resource: "statefulsets", Verbs: []string{"list"}},
	{Group: "apps", Resource: "daemonsets", Verbs: []string{"list"}},
	{Group: "batch", Resource: "jobs", Verbs: []string{"list"}},
	{Group: "batch", Resource: "cronjobs", Verbs: []string{"list"}},
	{Group: "networking.k8s.io", Resource: "networkpolicies", Verbs: []string{"list"}},
	{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verbs: []string{"list"}},
	{Group: "cilium.io", Resource: "ciliumnetworkpolicies", Verbs: []string{"list"}},
}

func (c *Controller) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name:    Name,
		Version: version.Version,
		Kinds: []sdk.KindInfo{{
			Kind:        kinds.Deployment,
			Description: "a user workload: one ReplicaSet per deployment, its pods reported as instances",
			SpecType:    string((&clusterv1.Deployment{}).ProtoReflect().Descriptor().FullName()),
		}},
		ConfigSchema: configSchema,
		Permissions:  Permissions,
	}}, nil
}

func (c *Controller) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	cfg, err := ParseConfig(req.Config)
	if err != nil {
		return nil, err
	}
	cfg.hostNamespace = hostNamespace(req.Kube.InCluster)
	var hooks []func(*rest.Config)
	if c.counter != nil {
		hooks = append(hooks, c.counter.Wrap)
	}
	clients, err := kube.Connect(ctx, req.Kube, Permissions, hooks...)
	if err != nil {
		return nil, err
	}
	k := &kubeState{clients: clients, dynamic: clients.Dynamic}
	if k.metadata, err = metadata.NewForConfig(clients.Config); err != nil {
		return nil, err
	}
	if cfg.RuntimeClass != "" {
		// Without its RuntimeClass every pod is refused at creation; say so
		// now, naming the key, rather than as pods that never appear.
		_, err := kube.Typed[nodev1.RuntimeClass, nodev1.RuntimeClassList](k.clients, "runtimeclasses", "").Get(ctx, cfg.RuntimeClass, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, &sdk.ConfigError{Key: "runtime_class", Reason: fmt.Sprintf("RuntimeClass %q does not exist in this cluster: install it, or set runtime_class to one that does (\"\" for none)", cfg.RuntimeClass)}
		}
		if err != nil {
			return nil, fmt.Errorf("read RuntimeClass %q: %w", cfg.RuntimeClass, err)
		}
	}
	if err := c.startInformers(ctx, k, cfg); err != nil {
		return nil, err
	}
	c.mu.Lock()
	old := c.kube
	c.cfg, c.kube, c.host = cfg, k, req.Host
	c.mu.Unlock()
	c.repair.SetHost(req.Host)
	c.envCache.setTTL(cfg.cacheTTL)
	c.SetResend(cfg.resync)
	c.ChangedAll()
	if old != nil {
		old.informers.Stop()
	}
	c.pulls.markAll()
	c.adoptRolls(k)
	c.startAdmitted(c.bg, c.rolls.resize(cfg.MaxConcurrentRolls, cfg.rollDeadline))
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID, "runtime_class", cfg.RuntimeClass, "status_resync_interval", cfg.resync)
	return &sdk.ConfigureResponse{}, nil
}

// startInformers fills k's caches. Only Krane's own ReplicaSets, pods,
// Secrets and namespaces are watched (label-selected), so the caches stay
// small and nothing else is ever touched or read; nodes are watched as
// metadata only, for their zone.
func (c *Controller) startInformers(ctx context.Context, k *kubeState, cfg Config) error {
	k.informers = kube.NewInformers()
	// The caches keep what status and drift read: pods slimmed (SlimPod
	// keeps every field instanceOf reads), PodDisruptionBudgets without
	// their status (only compared with what is applied). ReplicaSets keep
	// theirs (rolls and status read it); Secrets have none.
	ours := kube.InformerOptions{LabelSelector: kube.ManagedSelector(Component), Transform: kube.Chain(
		kube.StripManagedFields, kube.Slim(kube.SlimPod), kube.StripStatusOf[*policyv1.PodDisruptionBudget](), kube.StripStatusOf[*corev1.Service]())}
	rsInf := kube.Informer[appsv1.ReplicaSet, appsv1.ReplicaSetList](k.informers, k.clients, "replicasets", ours)
	podInf := kube.Informer[corev1.Pod, corev1.PodList](k.informers, k.clients, "pods", ours)
	secretInf := kube.Informer[corev1.Secret, corev1.SecretList](k.informers, k.clients, "secrets", ours)
	pdbInf := kube.Informer[policyv1.PodDisruptionBudget, policyv1.PodDisruptionBudgetList](k.informers, k.clients, "poddisruptionbudgets", ours)
	svcInf := kube.Informer[corev1.Service, corev1.ServiceList](k.informers, k.clients, "services", ours)
	nsInf := kube.Informer[corev1.Namespace, corev1.NamespaceList](k.informers, k.clients, "namespaces",
		kube.InformerOptions{LabelSelector: kube.ManagedByLabel + "=" + kube.ManagedBy})
	nodes := k.informers.Add(kube.NewMetadataInformer(k.metadata, nodesGVR, kube.InformerOptions{}), "nodes")

	for _, inf := range []cache.SharedIndexInformer{rsInf, podInf, secretInf, pdbInf, svcInf} {
		if err := inf.AddIndexers(deploymentIndexers); err != nil {
			return err
		}
	}
	for _, inf := range []cache.SharedIndexInformer{rsInf, podInf} {
		if _, err := inf.AddEventHandler(kube.OnChange(c, LabelDeployment)); err != nil {
			return err
		}
	}
	if _, err := rsInf.AddEventHandler(c.rollEvents()); err != nil {
		return err
	}
	if _, err := rsInf.AddEventHandler(c.repair.Handler(LabelDeployment)); err != nil {
		return err
	}
	if _, err := nsInf.AddEventHandler(c.namespaces.forgetDeleted()); err != nil {
		return err
	}
	if _, err := rsInf.AddEventHandler(c.nsEvents(false)); err != nil {
		return err
	}
	if _, err := secretInf.AddEventHandler(c.nsEvents(true)); err != nil {
		return err
	}
	k.pullSourceStores = map[string]cache.Store{}
	key, err := loadCopyKey(ctx, k, cfg)
	if err != nil {
		return err
	}
	k.copyKey = key
	if cfg.PullSecretNamespace != "" {
		// One informer per configured name, selected by field: no other
		// Secret of that namespace is listed or kept.
		for _, name := range cfg.pullSecretNames() {
			inf := kube.Informer[corev1.Secret, corev1.SecretList](k.informers, k.clients, "secrets", kube.InformerOptions{
				Namespace: cfg.PullSecretNamespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
			if _, err := inf.AddEventHandler(c.pullSourceEvents()); err != nil {
				return err
			}
			k.pullSourceStores[name] = inf.GetStore()
		}
	}
	k.replicaSets, k.pods = appslisters.NewReplicaSetLister(rsInf.GetIndexer()), corelisters.NewPodLister(podInf.GetIndexer())
	k.replicaSetIndex, k.podIndex = rsInf.GetIndexer(), podInf.GetIndexer()
	// Secrets need no event handler: they are only compared at Apply.
	k.secrets, k.secretIndex = corelisters.NewSecretLister(secretInf.GetIndexer()), secretInf.GetIndexer()
	// PodDisruptionBudgets and Services too: compared at Apply, no handler.
	k.pdbIndex, k.serviceIndex = pdbInf.GetIndexer(), svcInf.GetIndexer()
	k.namespaces = corelisters.NewNamespaceLister(nsInf.GetIndexer())
	k.nodes = cache.NewGenericLister(nodes.GetIndexer(), nodesGVR.GroupResource())
	return k.informers.Start(ctx, cacheSyncTimeout)
}

func (c *Controller) state() (Config, *kubeState) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cfg, c.kube
}

func (c *Controller) hostServices() sdk.Host {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.host
}

// Apply applies one change under the id's repair lock and records it for
// repairs (kube.Repairer.Apply). Inside it, applyLocked takes the id's
// lock as every apply of the plugin's own does (a roll's), always after
// the repair lock, never before: no two paths take them the other way.
func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return c.repair.Apply(ctx, req, c.applyLocked)
}

// applyLocked is apply under the deployment's lock (idLocks).
func (c *Controller) applyLocked(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	unlock := c.idLocks.lock(ch.ID)
	defer unlock()
	return c.apply(ctx, ch)
}

func (c *Controller) apply(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	cfg, k := c.state()
	if k == nil {
		return 0, fmt.Errorf("apply deployment %s: plugin not configured yet", ch.ID)
	}
	if ch.Kind != kinds.Deployment {
		return 0, sdk.Permanent(fmt.Errorf("kind %q is not reconciled by the deployment plugin", ch.Kind))
	}
	if errs := validation.IsValidLabelValue(ch.ID); len(errs) > 0 || ch.ID == "" {
		return 0, sdk.InvalidField("id", "%q is not usable as a label value: %s", ch.ID, firstOr(errs, "empty"))
	}
	if ch.Deleted {
		return c.remove(ctx, k, ch.ID, ch.Version, "")
	}
	d := &clusterv1.Deployment{}
	if err := ch.Spec.Decode(d); err != nil {
		return 0, err
	}
	if err := validate(ch.ID, d, cfg); err != nil {
		return 0, err
	}
	if old := c.desired.set(ch.ID, d.GetK8SNamespace()); old != "" && old != d.GetK8SNamespace() {
		c.pulls.mark(old) // a namespace it left may need its copies no more
	}
	if d.GetReplicas() == 0 {
		// Stopped: nothing may run, and an empty ReplicaSet is no use.
		return c.remove(ctx, k, ch.ID, ch.Version, d.GetK8SNamespace())
	}
	rs := buildReplicaSet(ch.ID, ch.Version, d, cfg)
	desired, err := kube.ToUnstructured(rs)
	if err != nil {
		return 0, fmt.Errorf("deployment %s: convert ReplicaSet: %w", ch.ID, err)
	}
	var secret *secretPlan
	if cfg.DecryptEnv && len(d.GetEncryptedEnv()) > 0 {
		secret = newSecretPlan(ch.ID, d)
	}
	if !c.unchanged(k, ch.ID, desired) {
		replaces := c.replacesTemplate(k, ch.ID, desired)
		if replaces {
			if err := c.failedRoll(k, ch.ID, ch.Version, desired); err != nil {
				return 0, err
			}
		}
		if replaces && !c.rolls.acquire(ch.ID, ch) {
			// Every roll slot is taken: the change is kept and applied by
			// the plugin when a slot frees (roll.go); nothing more to do now.
			rolling, waiting := c.rolls.counts()
			c.log.Info("template change waits for a roll slot", "deployment", ch.ID, "version", ch.Version, "rolling", rolling, "waiting", waiting)
			return sdk.Applied, nil
		}
		res, err := c.write(ctx, k, ch.ID, desired, secret)
		if err == nil {
			_, err = c.syncCompanions(ctx, k, ch.ID, d)
		}
		return res, err
	}
	wroteCompanion, err := c.syncCompanions(ctx, k, ch.ID, d)
	if err != nil {
		return 0, err
	}
	result := sdk.Unchanged
	if wroteCompanion {
		result = sdk.Applied
	}
	if ns := desired.GetNamespace(); !c.pullSecretsCurrent(cfg, k, ns) {
		// A copy edited or deleted by hand, or a source changed: the
		// pull Secrets' own sync would also repair it, this is sooner.
		unlock := c.nsLocks.rlock(ns)
		wrote, err := c.ensurePullSecrets(ctx, cfg, k, ns)
		unlock()
		if err != nil {
			return 0, err
		}
		if wrote {
			result = sdk.Applied
		}
	}
	if secret == nil {
		return result, nil
	}
	// The ReplicaSet is right; its Secret may not be (edited, deleted, or
	// not yet checked by this process).
	owner := c.liveOwner(k, desired)
	if c.secretCurrent(k, secret, owner) {
		return result, nil
	}
	unlock := c.nsLocks.rlock(secret.namespace)
	wrote, err := c.ensureSecret(ctx, k, c.hostServices(), secret, owner)
	unlock()
	if err != nil || !wrote {
		return result, err
	}
	return sdk.Applied, nil
}

// failedRoll is the error of the roll to desired when that roll already
// missed its deadline at this version (roll.go): it is not started again,
// so the old ReplicaSets keep serving and the slot stays free. When the
// ReplicaSet has become available since, the failure is forgotten and the
// roll goes on.
func (c *Controller) failedRoll(k *kubeState, id string, version uint64, desired *unstructured.Unstructured) error {
	f, ok := c.rolls.failure(id, desired.GetNamespace(), desired.GetName(), version)
	if !ok {
		return nil
	}
	if live, err := k.replicaSets.ReplicaSets(f.ns).Get(f.name); err == nil && live.DeletionTimestamp == nil && available(live) {
		c.rolls.forget(id)
		return nil
	}
	return f.err
}

// liveOwner is the owner reference to the desired ReplicaSet as the cache
// has it, nil when it does not exist yet.
func (c *Controller) liveOwner(k *kubeState, desired *unstructured.Unstructured) *metav1.OwnerReference {
	live, err := k.replicaSets.ReplicaSets(desired.GetNamespace()).Get(desired.GetName())
	if err != nil || live.DeletionTimestamp != nil {
		return nil
	}
	return ownerRef(live.Name, live.UID)
}

// unchanged reports, from the informer cache alone (no API call), whether
// the deployment's only ReplicaSet is the desired one with every field we
// set still holding our value.
func (c *Controller) unchanged(k *kubeState, id string, desired *unstructured.Unstructured) bool {
	current, err := ofDeployment[*appsv1.ReplicaSet](k.replicaSetIndex, id)
	if err != nil {
		return false
	}
	// A ReplicaSet already being deleted (a replaced template whose pods
	// are still stopping) is on its way out and needs nothing from us.
	current = slices.DeleteFunc(current, func(rs *appsv1.ReplicaSet) bool { return rs.DeletionTimestamp != nil })
	if len(current) != 1 {
		return false
	}
	live := current[0]
	if live.Namespace != desired.GetNamespace() || live.Name != desired.GetName() {
		return false
	}
	drift, err := kube.DriftObject(desired.Object, live)
	switch {
	case err != nil || drift == "":
	case desired.GetAnnotations()[kube.VersionAnnotation] != live.Annotations[kube.VersionAnnotation]:
		c.log.Debug("new version", "deployment", id, "replicaset", live.Namespace+"/"+live.Name, "field", drift)
	default:
		// Same version, different object: someone edited it.
		c.log.Info("drift, re-applying", "deployment", id, "replicaset", live.Namespace+"/"+live.Name, "field", drift)
	}
	return err == nil && drift == ""
}

// replacesTemplate reports whether applying desired starts (or continues)
// a roll: the cache holds a live ReplicaSet of the deployment other than
// the desired one.
func (c *Controller) replacesTemplate(k *kubeState, id string, desired *unstructured.Unstructured) bool {
	all, err := ofDeployment[*appsv1.ReplicaSet](k.replicaSetIndex, id)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(all, func(rs *appsv1.ReplicaSet) bool {
		return rs.DeletionTimestamp == nil && (rs.Namespace != desired.GetNamespace() || rs.Name != desired.GetName())
	})
}

// write applies the desired ReplicaSet (with its Secret first, see
// secrets.go). When the deployment has other ReplicaSets (an older
// template, a former name or namespace), that is a roll (roll.go): they
// are deleted, with the Secrets only they use, once the new one is
// available.
func (c *Controller) write(ctx context.Context, k *kubeState, id string, desired *unstructured.Unstructured, secret *secretPlan) (sdk.Result, error) {
	ns, name := desired.GetNamespace(), desired.GetName()
	version := kube.AppliedVersion(desired.GetAnnotations())
	// When a roll's clock starts, if this write turns out to be one
	// adopted from the cluster (roll.go): a re-apply of the ReplicaSet as
	// it is started no later than the ReplicaSet; anything else now.
	rollStart := time.Now()
	live, err := k.replicaSets.ReplicaSets(ns).Get(name)
	if err == nil && live.DeletionTimestamp != nil {
		return 0, fmt.Errorf("deployment %s: ReplicaSet %s/%s is being deleted (by hand?); it is created again once it is gone (retrying)", id, ns, name)
	}
	if err == nil && kube.AppliedVersion(live.Annotations) == version {
		rollStart = live.CreationTimestamp.Time
	}
	host := c.hostServices()
	unlock := c.nsLocks.rlock(ns)
	err = c.ensureNamespace(ctx, k, ns)
	if err == nil {
		// Before the ReplicaSet: its pods pull with these.
		cfg, _ := c.state()
		_, err = c.ensurePullSecrets(ctx, cfg, k, ns)
	}
	owner := c.liveOwner(k, desired)
	if err == nil && secret != nil {
		// Before the ReplicaSet: its pods must find the Secret.
		_, err = c.ensureSecret(ctx, k, host, secret, owner)
	}
	var applied metav1.Object
	if err == nil {
		applied, err = c.applyReplicaSet(ctx, k, id, desired)
		err = classify(err, id)
	}
	if err == nil && secret != nil && (owner == nil || owner.UID != applied.GetUID()) {
		// Now the ReplicaSet exists: it owns the Secret.
		_, err = c.ensureSecret(ctx, k, host, secret, ownerRef(applied.GetName(), applied.GetUID()))
	}
	c.namespaces.forgetIfGone(ns, err)
	unlock()
	if err != nil {
		return 0, err
	}
	// Older ReplicaSets of the deployment come from the cache: one the
	// cache has not seen yet leaves two behind, which the next apply or
	// resync finds (unchanged wants exactly one) and rolls away.
	all, err := ofDeployment[*appsv1.ReplicaSet](k.replicaSetIndex, id)
	if err != nil {
		return 0, fmt.Errorf("deployment %s: applied %s/%s, but listing its older ReplicaSets failed (retrying): %w", id, ns, name, err)
	}
	if slices.ContainsFunc(all, func(rs *appsv1.ReplicaSet) bool { return rs.Namespace != ns || rs.Name != name }) {
		if !c.rolls.holds(id) {
			c.rolls.adopt(id) // written already: count it, from now
			rollStart = time.Now()
		}
		c.rolls.setTarget(id, ns, name, version, rollStart)
		// Finishes at once when the new ReplicaSet is available already
		// (a scale of an existing one, a retry); otherwise its status
		// events drive the roll. A roll adopted here whose ReplicaSet is
		// past its deadline already fails at once, and so does this Apply.
		c.startAdmitted(c.bg, c.progress(ctx, id))
		if f, failed := c.rolls.failure(id, ns, name, version); failed {
			return 0, f.err
		}
		return sdk.Applied, nil
	}
	if c.rolls.holds(id) {
		c.startAdmitted(c.bg, c.rolls.release(id))
	}
	if err := c.deleteStaleSecrets(ctx, k, id, secret); err != nil {
		return 0, err
	}
	return sdk.Applied, nil
}

// applyReplicaSet server-side applies the ReplicaSet (answered in
// protobuf: see kube.ApplyTyped). An apply takes back every field we set,
// but cannot remove a list entry someone added under their own field
// manager (an env var, a container added by hand). When such drift
// survives the apply, the template and replica count are replaced with a
// JSON patch. The patch carries no resourceVersion precondition: the
// ReplicaSet controller rewrites the object several times a second while
// pods start, and an optimistic update lost that race under load. The API
// server applies the patch to whatever version it holds, and only the
// paths it names change, so a concurrent write elsewhere is kept and
// nothing is retried here.
func (c *Controller) applyReplicaSet(ctx context.Context, k *kubeState, id string, desired *unstructured.Unstructured) (metav1.Object, error) {
	rsClient := k.replicaSetClient(desired.GetNamespace())
	applied, err := kube.ApplyTyped(ctx, rsClient.Patch, desired)
	if err != nil {
		return nil, err
	}
	c.repair.Wrote(applied)
	// The drift check needs no managedFields, and converting them is most
	// of the conversion's cost.
	applied.ManagedFields = nil
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(applied)
	if err != nil {
		return nil, fmt.Errorf("convert applied ReplicaSet %s/%s: %w", applied.Namespace, applied.Name, err)
	}
	drift := kube.Drift(desired.Object, m)
	if drift == "" {
		return applied, nil
	}
	c.log.Info("drift survived the apply, replacing the template", "deployment", id, "replicaset", applied.Namespace+"/"+applied.Name, "field", drift)
	patch, err := replacePatch(desired)
	if err != nil {
		return nil, fmt.Errorf("replace template of ReplicaSet %s/%s: %w", applied.Namespace, applied.Name, err)
	}
	updated, err := rsClient.Patch(ctx, applied.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return nil, fmt.Errorf("replace template of ReplicaSet %s/%s: %w", applied.Namespace, applied.Name, err)
	}
	c.repair.Wrote(updated)
	return updated, nil
}

// replacePatch is a JSON patch (RFC 6902) that sets the ReplicaSet's pod
// template and replica count to the desired ones, whole. The selector is
// not in it: it is immutable, and the name (which carries the template
// hash) already pins it.
func replacePatch(desired *unstructured.Unstructured) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	for _, path := range []string{"template", "replicas"} {
		v, found, err := unstructured.NestedFieldNoCopy(desired.Object, "spec", path)
		if err != nil || !found {
			return nil, fmt.Errorf("desired ReplicaSet has no spec.%s (%v)", path, err)
		}
		ops = append(ops, op{Op: "replace", Path: "/spec/" + path, Value: v})
	}
	return json.Marshal(ops)
}

// remove deletes every ReplicaSet of the deployment and then the
// namespaces left empty. specNamespace, when known, is checked too, so a
// retry after a failed namespace removal still finds it.
func (c *Controller) remove(ctx context.Context, k *kubeState, id string, version uint64, specNamespace string) (sdk.Result, error) {
	// Recorded first: the status of the vanishing workload may be reported
	// while the deletes below are still running.
	c.Deleted(id, version)
	if ns := c.desired.drop(id); ns != "" {
		defer c.pulls.mark(ns)
	}
	// A live list, not the cache: a ReplicaSet created a moment ago must
	// not be missed and left running.
	all, err := k.replicaSetClient("").List(ctx, metav1.ListOptions{LabelSelector: byDeployment(id).String()})
	if err != nil {
		return 0, fmt.Errorf("deployment %s: list its ReplicaSets: %w", id, err)
	}
	namespaces, err := c.deleteReplicaSets(ctx, k, id, all.Items)
	if err != nil {
		return 0, err
	}
	// Owned by their ReplicaSet, the Secrets would go with it; deleting them
	// here also covers one orphaned by a crash before its owner was set.
	if err := c.deleteSecrets(ctx, k, id); err != nil {
		return 0, err
	}
	if err := c.deleteCompanions(ctx, k, id); err != nil {
		return 0, classify(err, id)
	}
	if specNamespace != "" {
		namespaces[specNamespace] = true
	}
	if err := c.removeNamespacesIfUnused(ctx, k, id, namespaces); err != nil {
		return 0, err
	}
	c.rolls.forget(id)
	c.startAdmitted(c.bg, c.rolls.release(id))
	return sdk.Deleted, nil
}

// deleteReplicaSets deletes rss (foreground: a ReplicaSet disappears only
// after its pods) and returns the namespaces they were in.
func (c *Controller) deleteReplicaSets(ctx context.Context, k *kubeState, id string, rss []appsv1.ReplicaSet) (map[string]bool, error) {
	namespaces := map[string]bool{}
	for _, rs := range rss {
		namespaces[rs.Namespace] = true
		if rs.DeletionTimestamp != nil {
			continue
		}
		c.repair.Deleting(rs.UID)
		err := k.replicaSetClient(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{
			PropagationPolicy: ptr(metav1.DeletePropagationForeground),
			Preconditions:     &metav1.Preconditions{UID: &rs.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nil, classify(fmt.Errorf("delete ReplicaSet %s/%s: %w", rs.Namespace, rs.Name, err), id)
		}
		c.log.Info("ReplicaSet deleted", "deployment", id, "replicaset", rs.Namespace+"/"+rs.Name)
	}
	return namespaces, nil
}

func (c *Controller) removeNamespacesIfUnused(ctx context.Context, k *kubeState, id string, namespaces map[string]bool) error {
	var errs []error
	for _, ns := range slices.Sorted(maps.Keys(namespaces)) {
		unlock := c.nsLocks.lock(ns)
		errs = append(errs, c.removeNamespaceIfUnused(ctx, k, ns))
		unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deployment %s: %w", id, err)
	}
	return nil
}

// classify marks API errors that a retry cannot fix as permanent, with a
// hint for the operator.
func classify(err error, id string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return fmt.Errorf("deployment %s: its namespace is being deleted; retrying once it is gone: %w", id, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsRequestEntityTooLargeError(err):
		return sdk.Permanent(fmt.Errorf("deployment %s: the API server rejected the ReplicaSet: %w", id, err))
	case apierrors.IsForbidden(err):
		return sdk.Permanent(fmt.Errorf("deployment %s: %w (does the plugin's identity have the ClusterRole from rbac.yaml?)", id, err))
	}
	return fmt.Errorf("deployment %s: %w", id, err)
}

func (c *Controller) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	_, k := c.state()
	if req.Kind != kinds.Deployment || k == nil {
		return &sdk.InventoryResponse{}, nil
	}
	// While a template is being replaced, two ReplicaSets share an id: the
	// newer version is the applied one.
	rss, err := k.replicaSets.List(labels.Everything())
	// The host asks after applying a whole bootstrap: the plugin now holds
	// every deployment (pulltargets.go).
	c.desired.markComplete()
	return kube.Inventory(kinds.Deployment, LabelDeployment, rss), err
}

func (c *Controller) Shutdown(ctx context.Context) error {
	c.stopBG()
	c.mu.Lock()
	k := c.kube
	c.kube = nil
	c.mu.Unlock()
	if k == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { k.informers.Stop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("informers did not stop before the deadline: %w", ctx.Err())
	}
}

// byDeployment selects one deployment's objects.
func byDeployment(id string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: Component, LabelDeployment: id})
}

// cacheSyncTimeout bounds Configure's wait for the informer caches.
const cacheSyncTimeout = 2 * time.Minute

// statusTick is how long status changes are coalesced before a report.
const statusTick = 250 * time.Millisecond
