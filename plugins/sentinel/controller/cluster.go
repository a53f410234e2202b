package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// bySentinel indexes cached objects by their unkey.com/sentinel.id label.
const bySentinel = "sentinel"

// cluster is one configuration of the plugin: clients, informer caches of
// the namespace's sentinel objects, and the watch on the CiliumNetworkPolicy
// CRD. Configure replaces it as a whole.
type cluster struct {
	p   params
	log hclog.Logger

	clients *kube.Clients
	dyn     dynamic.Interface
	meta    metadata.Interface
	// host opens sentinels' credentials (through ctrl); nil without host
	// services.
	host sdk.Host

	namespaces  cache.Indexer
	deployments cache.Indexer
	replicaSets cache.Indexer
	pods        cache.Indexer
	services    cache.Indexer
	pdbs        cache.Indexer
	routes      cache.Indexer
	// serviceAccounts holds the pods' account only (selected by name).
	serviceAccounts cache.Indexer
	// secrets caches the credentials Secrets' metadata (never their data).
	secrets cache.Indexer
	// verified: the credentials Secrets this configuration wrote.
	verified kube.VerifiedSecrets
	// policies is nil while cilium.io/v2 CiliumNetworkPolicy is not served.
	policies atomic.Pointer[policyCache]

	// feed is told the sentinel id of every object event, and that every
	// sentinel's status may have changed when the policy CRD comes or goes.
	feed *sdk.StatusFeed
	// repair is told of every object the plugin writes or deletes, so
	// that only someone else's changes are repaired.
	repair *kube.Repairer

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// policyCache is the informer of the gossip policies; it exists while the
// CRD is served.
type policyCache struct {
	indexer cache.Indexer
	stop    chan struct{}
}

type clusterDeps struct {
	clients           *kube.Clients
	host              sdk.Host
	repair            *kube.Repairer
	params            params
	log               hclog.Logger
	feed              *sdk.StatusFeed
	discoveryInterval time.Duration
}

// startCluster fills the caches and starts watching for the policy CRD
// (the plugin's permissions were checked by kube.Connect).
func startCluster(ctx context.Context, d clusterDeps) (*cluster, error) {
	cctx, cancel := context.WithCancel(context.Background())
	c := &cluster{p: d.params, log: d.log, clients: d.clients, dyn: d.clients.Dynamic, host: d.host, feed: d.feed, repair: d.repair, ctx: cctx, cancel: cancel}
	md, err := metadata.NewForConfig(d.clients.Config)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	c.meta = md
	ok := false
	defer func() {
		if !ok {
			c.close()
		}
	}()
	if err := c.startInformers(ctx); err != nil {
		return nil, err
	}
	served, err := c.policyServed()
	if err != nil {
		return nil, fmt.Errorf("discovery of cilium.io/v2: %w", err)
	}
	if served {
		if err := c.startPolicyInformer(ctx); err != nil {
			return nil, err
		}
	} else {
		c.logPolicyCRDMissing(d.discoveryInterval)
	}
	c.done.Add(1)
	go c.watchPolicyCRD(d.discoveryInterval)
	ok = true
	return c, nil
}

// close stops the informers and the CRD watch.
func (c *cluster) close() {
	c.cancel()
	c.done.Wait()
	if pc := c.policies.Swap(nil); pc != nil {
		close(pc.stop)
	}
}

func (c *cluster) startInformers(ctx context.Context) error {
	ns := c.p.Namespace
	selector := kube.ManagedSelector(Component)
	objects := kube.InformerOptions{
		Namespace: ns,
		// Only Krane's sentinel objects: the cache stays small and the
		// plugin never sees anything it does not manage. Pods and
		// ReplicaSets carry the pod template's labels.
		LabelSelector: selector,
		// What status and drift never read is not kept: pods are slimmed
		// (SlimPod keeps what sentinelStatus reads), and the status of
		// ReplicaSets, Services and PodDisruptionBudgets is dropped (the
		// Deployment's is read; status is never applied, so drift does not
		// look at it).
		Transform: kube.Chain(kube.StripManagedFields, kube.Slim(kube.SlimPod),
			kube.StripStatusOf[*appsv1.ReplicaSet](), kube.StripStatusOf[*corev1.Service](), kube.StripStatusOf[*policyv1.PodDisruptionBudget]()),
	}
	inf := kube.NewInformers()
	for _, x := range []struct {
		into *cache.Indexer
		inf  cache.SharedIndexInformer
		// written: the plugin writes these objects, so a change by
		// someone else is repaired at once.
		written bool
	}{
		{&c.deployments, kube.Informer[appsv1.Deployment, appsv1.DeploymentList](inf, c.clients, "deployments", objects), true},
		{&c.replicaSets, kube.Informer[appsv1.ReplicaSet, appsv1.ReplicaSetList](inf, c.clients, "replicasets", objects), false},
		{&c.pods, kube.Informer[corev1.Pod, corev1.PodList](inf, c.clients, "pods", objects), false},
		{&c.services, kube.Informer[corev1.Service, corev1.ServiceList](inf, c.clients, "services", objects), true},
		{&c.pdbs, kube.Informer[policyv1.PodDisruptionBudget, policyv1.PodDisruptionBudgetList](inf, c.clients, "poddisruptionbudgets", objects), true},
		{&c.routes, kube.Informer[corev1.ConfigMap, corev1.ConfigMapList](inf, c.clients, "configmaps", objects), true},
	} {
		if err := x.inf.AddIndexers(cache.Indexers{bySentinel: sentinelIndex}); err != nil {
			return err
		}
		if _, err := x.inf.AddEventHandler(c.eventHandler()); err != nil {
			return err
		}
		if x.written {
			if _, err := x.inf.AddEventHandler(c.repair.Handler(LabelSentinel)); err != nil {
				return err
			}
		}
		*x.into = x.inf.GetIndexer()
	}
	c.namespaces = kube.Informer[corev1.Namespace, corev1.NamespaceList](inf, c.clients, "namespaces",
		kube.InformerOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", ns).String()}).GetIndexer()
	c.serviceAccounts = kube.Informer[corev1.ServiceAccount, corev1.ServiceAccountList](inf, c.clients, "serviceaccounts",
		kube.InformerOptions{Namespace: ns, FieldSelector: fields.OneTermEqualSelector("metadata.name", c.p.ServiceAccount).String()}).GetIndexer()
	// Credentials Secrets as metadata: their data never crosses the wire
	// into the cache.
	secretInformer := inf.Add(kube.NewMetadataInformer(c.meta, secretsGVR, kube.InformerOptions{Namespace: ns, LabelSelector: selector}), "secrets")
	if err := secretInformer.AddIndexers(cache.Indexers{bySentinel: sentinelIndex}); err != nil {
		return err
	}
	c.secrets = secretInformer.GetIndexer()
	// The informers live as long as this configuration: they stop with
	// c.ctx (close), or at once when they do not sync.
	context.AfterFunc(c.ctx, inf.Stop)
	if err := inf.Start(ctx, 0); err != nil {
		return fmt.Errorf("namespace %q: %w", ns, err)
	}
	return nil
}

// eventHandler tells the status feed which sentinel an event concerns.
func (c *cluster) eventHandler() cache.ResourceEventHandler {
	return kube.OnChange(c.feed, LabelSentinel)
}

func sentinelIndex(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	if id := m.GetLabels()[LabelSentinel]; id != "" {
		return []string{id}, nil
	}
	return nil, nil
}

// ---- the CiliumNetworkPolicy CRD ----

// policyServed asks discovery whether cilium.io/v2 serves
// ciliumnetworkpolicies (one GET, no write).
func (c *cluster) policyServed() (bool, error) {
	return kube.Served(c.ctx, c.clients, PolicyGVR)
}

func (c *cluster) startPolicyInformer(ctx context.Context) error {
	inf := kube.NewDynamicInformer(c.dyn, PolicyGVR, kube.InformerOptions{Namespace: c.p.Namespace, LabelSelector: kube.ManagedSelector(Component), Transform: compactPolicy})
	if err := inf.AddIndexers(cache.Indexers{bySentinel: sentinelIndex}); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(c.eventHandler()); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(c.repair.Handler(LabelSentinel)); err != nil {
		return err
	}
	stop := make(chan struct{})
	go inf.Run(stop)
	if !cache.WaitForCacheSync(mergeDone(ctx, c.ctx), inf.HasSynced) {
		close(stop)
		return fmt.Errorf("informer cache of CiliumNetworkPolicies in namespace %q did not sync (may the plugin list and watch ciliumnetworkpolicies.cilium.io?)", c.p.Namespace)
	}
	c.policies.Store(&policyCache{indexer: inf.GetIndexer(), stop: stop})
	return nil
}

func (c *cluster) logPolicyCRDMissing(interval time.Duration) {
	c.log.Warn(fmt.Sprintf("CiliumNetworkPolicy CRD (cilium.io/v2) is not served by this cluster: sentinels get their Deployment, Services and PodDisruptionBudget but no gossip policy; the plugin checks every %s and applies the policies once the CRD is installed", interval))
}

// watchPolicyCRD polls discovery and follows the CRD: when it appears, the
// policy cache starts and every sentinel's missing policy is applied; when
// it goes away, the cache stops. No restart is needed either way.
func (c *cluster) watchPolicyCRD(interval time.Duration) {
	defer c.done.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		served, err := c.policyServed()
		if err != nil {
			c.log.Debug("discovery of cilium.io/v2 failed; keeping the last answer", "error", err)
			continue
		}
		switch cur := c.policies.Load(); {
		case served && cur == nil:
			if err := c.startPolicyInformer(c.ctx); err != nil {
				c.log.Error("CiliumNetworkPolicy CRD is served but its cache failed to start; retrying", "error", err)
				continue
			}
			n, err := c.applyMissingPolicies(c.ctx)
			if err != nil {
				c.log.Error("applying gossip policies after the CRD appeared; the next resync retries", "applied", n, "error", err)
			} else {
				c.log.Info("CiliumNetworkPolicy CRD is now served: gossip policies applied", "applied", n)
			}
			c.feed.ChangedAll()
		case !served && cur != nil:
			if c.policies.CompareAndSwap(cur, nil) {
				close(cur.stop)
			}
			c.logPolicyCRDMissing(interval)
			c.feed.ChangedAll()
		}
	}
}

// applyMissingPolicies applies the gossip policy of every managed sentinel
// that has none, building it from the live Deployment. Existing policies
// are left to Apply, which owns their updates.
func (c *cluster) applyMissingPolicies(ctx context.Context) (int, error) {
	pc := c.policies.Load()
	if pc == nil {
		return 0, nil
	}
	var errs []error
	n := 0
	for _, obj := range c.deployments.List() {
		d := obj.(*appsv1.Deployment)
		id := identityFromDeployment(d)
		if id.ID == "" || d.DeletionTimestamp != nil {
			continue
		}
		if _, exists, _ := pc.indexer.GetByKey(c.p.Namespace + "/" + gossipName(d.Name)); exists {
			continue
		}
		desired, err := buildGossipPolicy(id, c.p, ownerRef(d))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := kube.Apply(ctx, c.dyn, PolicyGVR, desired); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// ---- cache lookups ----

// allDeployments lists every cached sentinel Deployment; none before
// Configure (c is nil).
func (c *cluster) allDeployments() []*appsv1.Deployment {
	if c == nil {
		return nil
	}
	objs := c.deployments.List()
	out := make([]*appsv1.Deployment, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*appsv1.Deployment))
	}
	return out
}

func (c *cluster) deploymentsOf(id string) []*appsv1.Deployment {
	return byIndex[*appsv1.Deployment](c.deployments, id)
}

func (c *cluster) replicaSetsOf(id string) []*appsv1.ReplicaSet {
	return byIndex[*appsv1.ReplicaSet](c.replicaSets, id)
}

func (c *cluster) podsOf(id string) []*corev1.Pod { return byIndex[*corev1.Pod](c.pods, id) }

func (c *cluster) servicesOf(id string) []*corev1.Service {
	return byIndex[*corev1.Service](c.services, id)
}

func (c *cluster) pdbsOf(id string) []*policyv1.PodDisruptionBudget {
	return byIndex[*policyv1.PodDisruptionBudget](c.pdbs, id)
}

func (c *cluster) routesOf(id string) []*corev1.ConfigMap {
	return byIndex[*corev1.ConfigMap](c.routes, id)
}

func (c *cluster) secretsOf(id string) []*metav1.PartialObjectMetadata {
	return byIndex[*metav1.PartialObjectMetadata](c.secrets, id)
}

func (c *cluster) policiesOf(id string) []*cachedPolicy {
	pc := c.policies.Load()
	if pc == nil {
		return nil
	}
	return byIndex[*cachedPolicy](pc.indexer, id)
}

// live is the cached policy namespace/name as an object to compare with
// the desired one, or nil when the cache holds none.
func (pc *policyCache) live(namespace, name string) runtime.Object {
	p := cached[*cachedPolicy](pc.indexer, namespace, name)
	if p == nil {
		return nil
	}
	u, err := p.object()
	if err != nil {
		return nil // cannot happen (the cache wrote the JSON); nil re-applies
	}
	return u
}

// cachedPolicy is a gossip policy as the cache keeps it: the metadata that
// lookups, the index and events read, and the whole object (less status
// and managedFields) as JSON, decoded only to compare it with the desired
// policy at an apply. Kept as an unstructured object, the nested maps of
// each policy cost several times its JSON: at 2,000 sentinels that was the
// largest part of the plugin's heap.
type cachedPolicy struct {
	metav1.ObjectMeta
	doc []byte
}

func (p *cachedPolicy) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject shares doc, which is never written after the transform.
func (p *cachedPolicy) DeepCopyObject() runtime.Object {
	return &cachedPolicy{ObjectMeta: *p.ObjectMeta.DeepCopy(), doc: p.doc}
}

// object decodes the cached JSON (numbers become float64, which Drift
// compares by value).
func (p *cachedPolicy) object() (*unstructured.Unstructured, error) {
	var m map[string]any
	if err := json.Unmarshal(p.doc, &m); err != nil {
		return nil, fmt.Errorf("cached CiliumNetworkPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// compactPolicy is the policy informer's transform: a listed or watched
// policy becomes a cachedPolicy. Anything else (a compacted policy again)
// passes unchanged.
func compactPolicy(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
	doc, err := json.Marshal(u.Object)
	if err != nil {
		return nil, fmt.Errorf("cache CiliumNetworkPolicy %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &cachedPolicy{ObjectMeta: metav1.ObjectMeta{
		Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(),
		Generation: u.GetGeneration(), Labels: u.GetLabels(), DeletionTimestamp: u.GetDeletionTimestamp(),
	}, doc: doc}, nil
}

func byIndex[T any](idx cache.Indexer, id string) []T {
	objs, _ := idx.ByIndex(bySentinel, id)
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// cached returns the object namespace/name from idx, or nil.
func cached[T any](idx cache.Indexer, namespace, name string) T {
	var zero T
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	obj, exists, _ := idx.GetByKey(key)
	if !exists {
		return zero
	}
	t, _ := obj.(T)
	return t
}

// mergeDone is a channel closed when either context ends.
func mergeDone(a, b context.Context) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		select {
		case <-a.Done():
		case <-b.Done():
		}
	}()
	return ch
}
