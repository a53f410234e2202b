package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Scheme holds the built-in types the typed clients and informers of this
// package decode: core/v1, apps/v1, policy/v1, node/v1, authorization/v1
// and authentication/v1. client-go's own scheme
// (k8s.io/client-go/kubernetes/scheme, which its clientset and informer
// factory import) registers every built-in group, and so links every
// group's generated code into every plugin that imports it, whatever the
// plugin uses: a plugin built on this package is some 15 MB smaller. A
// plugin that needs another built-in group registers it before its first
// client, e.g. utilruntime.Must(batchv1.AddToScheme(kube.Scheme)).
var Scheme = runtime.NewScheme()

var (
	codecs         serializer.CodecFactory
	parameterCodec runtime.ParameterCodec
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, nodev1.AddToScheme,
		authorizationv1.AddToScheme, authenticationv1.AddToScheme} {
		utilruntime.Must(add(Scheme))
	}
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	codecs = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
}

// Object is a typed Kubernetes object: T of Typed and Informer is a
// pointer to one, e.g. *appsv1.ReplicaSet.
type Object interface {
	metav1.Object
	runtime.Object
}

// Clients are a plugin's connection to its cluster.
type Clients struct {
	Config  *rest.Config
	Dynamic dynamic.Interface

	// The typed clients' REST clients, one per group and version, sharing
	// one HTTP client (its connections).
	http *http.Client
	mu   sync.Mutex
	rest map[schema.GroupVersion]rest.Interface
}

// NewClients returns the clients of cfg: typed ones (Typed, Informer) that
// speak protobuf to the API server, with JSON the fallback, and a dynamic
// one that keeps cfg's JSON (CRDs have no protobuf form). Protobuf is
// several times cheaper than JSON to encode on the API server and to
// decode here, which matters when thousands of objects arrive at once;
// cfg itself is not changed.
func NewClients(cfg *rest.Config) (*Clients, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c := &Clients{Config: cfg, http: hc, rest: map[schema.GroupVersion]rest.Interface{}}
	if c.Dynamic, err = dynamic.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return c, nil
}

// restFor is the REST client of one group and version of Scheme.
func (c *Clients) restFor(gv schema.GroupVersion) (rest.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rc, ok := c.rest[gv]; ok {
		return rc, nil
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	if gv.Group == "" {
		cfg.APIPath = "/api"
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.NegotiatedSerializer = codecs.WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(cfg, c.http)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client of %s: %w", gv, err)
	}
	c.rest[gv] = rc
	return rc, nil
}

// Client is a typed client of one resource, T its type and L its list
// type (see Typed). It makes the calls client-go's generated typed clients
// make; client-go's generic one (k8s.io/client-go/gentype) would do, but
// it links client-go's test fakes, and through them the managed-fields and
// OpenAPI model packages, into every plugin.
type Client[T Object, L runtime.Object] struct {
	rest      rest.Interface
	resource  string
	namespace string
	newT      func() T
	newL      func() L
}

// Typed returns a client of one resource of the built-in types (e.g.
// "replicasets"), whose type is O (e.g. appsv1.ReplicaSet, registered in
// Scheme) and list type LO, in namespace ("" for every namespace, and for
// cluster-scoped resources).
//
//	rss := kube.Typed[appsv1.ReplicaSet, appsv1.ReplicaSetList](k, "replicasets", ns)
//
// A type Scheme does not know is a programming error: Typed panics.
func Typed[O, LO any, T interface {
	*O
	Object
}, L interface {
	*LO
	runtime.Object
}](c *Clients, resource, namespace string) *Client[T, L] {
	return &Client[T, L]{rest: c.restOf(T(new(O))), resource: resource, namespace: namespace,
		newT: func() T { return T(new(O)) }, newL: func() L { return L(new(LO)) }}
}

// TypedCreate is Typed for the resources that are only ever created and
// have no list type (SelfSubjectAccessReview, TokenReview...): only its
// Create may be called.
func TypedCreate[O any, T interface {
	*O
	Object
}](c *Clients, resource string) *Client[T, T] {
	return &Client[T, T]{rest: c.restOf(T(new(O))), resource: resource,
		newT: func() T { return T(new(O)) }, newL: func() T { return T(new(O)) }}
}

func (c *Client[T, L]) request(r *rest.Request) *rest.Request {
	return r.NamespaceIfScoped(c.namespace, c.namespace != "").Resource(c.resource)
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Get reads one object.
func (c *Client[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := c.newT()
	err := c.request(c.rest.Get()).Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

// List lists objects.
func (c *Client[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := c.newL()
	err := c.request(c.rest.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

// Watch watches objects.
func (c *Client[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(c.rest.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeoutOf(opts)).Watch(ctx)
}

// Create creates obj.
func (c *Client[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := c.newT()
	err := c.request(c.rest.Post()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update replaces obj.
func (c *Client[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := c.newT()
	err := c.request(c.rest.Put()).Name(obj.GetName()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Delete deletes one object.
func (c *Client[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.request(c.rest.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

// Patch patches one object (or a subresource of it).
func (c *Client[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := c.newT()
	err := c.request(c.rest.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

// restOf is the REST client of obj's group and version.
func (c *Clients) restOf(obj runtime.Object) rest.Interface {
	gvks, _, err := Scheme.ObjectKinds(obj)
	if err != nil {
		panic(fmt.Sprintf("kube.Typed: %T is not registered in kube.Scheme: %v (register its API group before the first client, e.g. utilruntime.Must(batchv1.AddToScheme(kube.Scheme)); sdk/CHANGELOG.md, v0.1.0)", obj, err))
	}
	rc, err := c.restFor(gvks[0].GroupVersion())
	if err != nil {
		// Only a malformed rest.Config fails here, and NewClients already
		// built an HTTP client from the same one.
		panic(fmt.Sprintf("kube.Typed: %v", err))
	}
	return rc
}

// InformerOptions narrow what an informer caches.
type InformerOptions struct {
	// Namespace, "" for every namespace.
	Namespace string
	// LabelSelector and FieldSelector select the objects (e.g.
	// ManagedSelector(component)); "" selects every one.
	LabelSelector, FieldSelector string
	// Transform replaces StripManagedFields as what the cache keeps of
	// each object: give it Chain(StripManagedFields, ...) (transform.go).
	Transform cache.TransformFunc
}

// NewInformer returns an informer (not started) of one resource of the
// built-in types (see Typed for O, LO and resource), over the objects o
// selects, with a namespace index when it spans every namespace. Every informer of this package drops
// managedFields (unless o.Transform says otherwise), which are most of an
// object's size and never read.
func NewInformer[O, LO any, T interface {
	*O
	Object
}, L interface {
	*LO
	runtime.Object
}](c *Clients, resource string, o InformerOptions) cache.SharedIndexInformer {
	client := Typed[O, LO, T, L](c, resource, o.Namespace)
	return newInformer(T(new(O)), o,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return client.List(ctx, opts)
		},
		client.Watch)
}

// Informer is NewInformer added to i: it starts with i.Start.
func Informer[O, LO any, T interface {
	*O
	Object
}, L interface {
	*LO
	runtime.Object
}](i *Informers, c *Clients, resource string, o InformerOptions) cache.SharedIndexInformer {
	return i.Add(NewInformer[O, LO, T, L](c, resource, o), resource)
}

// NewDynamicInformer returns an informer (not started) of a resource the
// dynamic client reads (a custom resource, typically), as unstructured
// objects.
func NewDynamicInformer(client dynamic.Interface, gvr schema.GroupVersionResource, o InformerOptions) cache.SharedIndexInformer {
	res := client.Resource(gvr).Namespace(o.Namespace)
	return newInformer(&unstructured.Unstructured{}, o,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return res.List(ctx, opts) },
		res.Watch)
}

// NewMetadataInformer returns an informer (not started) of the metadata
// alone (names, labels, annotations) of a resource, e.g. of nodes for
// their zone labels, or of Secrets whose data must not be cached.
func NewMetadataInformer(client metadata.Interface, gvr schema.GroupVersionResource, o InformerOptions) cache.SharedIndexInformer {
	res := client.Resource(gvr).Namespace(o.Namespace)
	return newInformer(&metav1.PartialObjectMetadata{}, o,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return res.List(ctx, opts) },
		res.Watch)
}

func newInformer(example runtime.Object, o InformerOptions, list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	narrow := func(opts metav1.ListOptions) metav1.ListOptions {
		opts.LabelSelector, opts.FieldSelector = o.LabelSelector, o.FieldSelector
		return opts
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return list(ctx, narrow(opts))
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return watchFn(ctx, narrow(opts))
		},
	}
	// The namespace index serves listers' per-namespace lists; over one
	// namespace it would hold every key a second time for nothing.
	indexers := cache.Indexers{}
	if o.Namespace == "" {
		indexers[cache.NamespaceIndex] = cache.MetaNamespaceIndexFunc
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{Indexers: indexers})
	transform := o.Transform
	if transform == nil {
		transform = StripManagedFields
	}
	_ = inf.SetTransform(transform) // cannot fail before the informer runs
	return inf
}

// InformerOf is Informer as a OneObject.Informer: the informer of
// resource, narrowed to the plugin's objects.
func InformerOf[O, LO any, T interface {
	*O
	Object
}, L interface {
	*LO
	runtime.Object
}](resource string) func(i *Informers, c *Clients, selector string) cache.SharedIndexInformer {
	return func(i *Informers, c *Clients, selector string) cache.SharedIndexInformer {
		return Informer[O, LO, T, L](i, c, resource, InformerOptions{LabelSelector: selector})
	}
}

// Served asks the API server's discovery whether it serves gvr (one GET of
// its group and version, no write): a custom resource is served only once
// its CRD is installed. It answers false, and no error, when the group and
// version are not served at all.
func Served(ctx context.Context, c *Clients, gvr schema.GroupVersionResource) (bool, error) {
	path := "/apis/" + gvr.Group + "/" + gvr.Version
	if gvr.Group == "" {
		path = "/api/" + gvr.Version
	}
	body, err := c.restOf(&corev1.Namespace{}).Get().AbsPath(path).SetHeader("Accept", "application/json").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", gvr.GroupVersion(), err)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(body, &list); err != nil {
		return false, fmt.Errorf("discover %s: %w", gvr.GroupVersion(), err)
	}
	for _, r := range list.APIResources {
		if r.Name == gvr.Resource {
			return true, nil
		}
	}
	return false, nil
}
