package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sentinel/proxy"
	"krane.dev/sentinel/routes"
)

// Options configure Run.
type Options struct {
	Client kubernetes.Interface
	// Namespace and Name of the routes ConfigMap.
	Namespace, Name string
	// SentinelID and EnvironmentID must match the routes (an empty
	// sentinel_id in the routes matches any): a ConfigMap of another
	// environment is refused rather than served.
	SentinelID, EnvironmentID string
	Router                    *proxy.Router
	Logger                    hclog.Logger
	// SyncTimeout bounds the wait for a new backend's slices before the
	// switch happens anyway (default 30s).
	SyncTimeout time.Duration
	// DrainTimeout bounds how long a replaced backend's watch is kept for
	// its in-flight requests (default 5m).
	DrainTimeout time.Duration
}

// Run watches until ctx ends. It returns an error only when it cannot
// start; problems with the routes are logged and the last good routes kept.
func Run(ctx context.Context, o Options) error {
	if o.Client == nil || o.Router == nil || o.Namespace == "" || o.Name == "" {
		return errors.New("watch: Client, Router, Namespace and Name are required")
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = 30 * time.Second
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 5 * time.Minute
	}
	w := &watcher{o: o, log: o.Logger, wake: make(chan struct{}, 1)}
	return w.run(ctx)
}

type watcher struct {
	o    Options
	log  hclog.Logger
	wake chan struct{}

	mu     sync.Mutex
	latest *corev1.ConfigMap
	gone   bool

	current *backendWatch
	applied string // resourceVersion of the ConfigMap last looked at
	drains  sync.WaitGroup
}

// backendWatch is a backend and the informer on its slices.
type backendWatch struct {
	b      *proxy.Backend
	cancel context.CancelFunc
	done   chan struct{}
}

func (w *watcher) run(ctx context.Context) error {
	lw := cache.NewFilteredListWatchFromClient(w.o.Client.CoreV1().RESTClient(), "configmaps", w.o.Namespace,
		func(lo *metav1.ListOptions) { lo.FieldSelector = "metadata.name=" + w.o.Name })
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	set := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			w.mu.Lock()
			w.latest, w.gone = cm, false
			w.mu.Unlock()
			w.signal()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) {
			w.mu.Lock()
			w.gone = true
			w.mu.Unlock()
			w.signal()
		},
	}); err != nil {
		return fmt.Errorf("watch: routes ConfigMap handler: %w", err)
	}
	infCtx, stop := context.WithCancel(ctx)
	var infDone sync.WaitGroup
	infDone.Add(1)
	go func() { defer infDone.Done(); inf.RunWithContext(infCtx) }()
	defer func() {
		stop()
		infDone.Wait()
		if w.current != nil {
			w.current.cancel()
			<-w.current.done
		}
		w.drains.Wait()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	w.mu.Lock()
	missing := w.latest == nil
	w.mu.Unlock()
	if missing {
		w.log.Warn("routes ConfigMap not found; not ready until it exists", "configmap", w.o.Namespace+"/"+w.o.Name,
			"fix", "the sentinel plugin writes it; check that the plugin runs and that this pod may get/list/watch configmaps in "+w.o.Namespace)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
			w.update(ctx)
		}
	}
}

func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// update applies the latest ConfigMap.
func (w *watcher) update(ctx context.Context) {
	w.mu.Lock()
	cm, gone := w.latest, w.gone
	w.mu.Unlock()
	if gone {
		w.log.Warn("routes ConfigMap deleted; serving the last routes", "configmap", w.o.Namespace+"/"+w.o.Name)
		return
	}
	if cm == nil || cm.ResourceVersion == w.applied {
		return
	}
	w.applied = cm.ResourceVersion
	r, err := routes.Parse([]byte(cm.Data[routes.Key]))
	if err == nil {
		err = w.belongs(r)
	}
	if err != nil {
		w.log.Error("routes refused; serving the last good routes", "configmap", w.o.Namespace+"/"+w.o.Name, "error", err)
		return
	}
	var next *backendWatch
	switch {
	case r.Backend == nil:
	case w.current != nil && w.current.b.Spec() == *r.Backend:
		next = w.current
	default:
		next = w.watchBackend(ctx, *r.Backend)
	}
	var nb *proxy.Backend
	if next != nil {
		nb = next.b
	}
	if err := w.o.Router.Apply(r, nb); err != nil {
		w.log.Error("routes not applied", "error", err)
		return
	}
	w.log.Info("routes applied", "version", r.Version, "hosts", len(r.Hosts), "deployment", deploymentOf(r))
	if old := w.current; old != nil && old != next {
		w.drains.Add(1)
		go w.drain(old)
	}
	w.current = next
}

func (w *watcher) belongs(r *routes.Routes) error {
	if r.EnvironmentID != w.o.EnvironmentID {
		return fmt.Errorf("routes are for environment %s, this sentinel serves %s; fix KRANE_SENTINEL_ROUTES or the ConfigMap", r.EnvironmentID, w.o.EnvironmentID)
	}
	if r.SentinelID != "" && w.o.SentinelID != "" && r.SentinelID != w.o.SentinelID {
		return fmt.Errorf("routes are for sentinel %s, this is %s; fix KRANE_SENTINEL_ROUTES or the ConfigMap", r.SentinelID, w.o.SentinelID)
	}
	return nil
}

func deploymentOf(r *routes.Routes) string {
	if r.Backend == nil {
		return ""
	}
	return r.Backend.DeploymentID
}

// watchBackend starts the slice informer of a backend and waits (at most
// SyncTimeout) until its instances are known.
func (w *watcher) watchBackend(ctx context.Context, spec routes.Backend) *backendWatch {
	b := w.o.Router.NewBackend(spec)
	bctx, cancel := context.WithCancel(ctx)
	bw := &backendWatch{b: b, cancel: cancel, done: make(chan struct{})}
	sel := discoveryv1.LabelServiceName + "=" + spec.Service
	lw := cache.NewFilteredListWatchFromClient(w.o.Client.DiscoveryV1().RESTClient(), "endpointslices", spec.Namespace,
		func(lo *metav1.ListOptions) { lo.LabelSelector = sel })
	inf := cache.NewSharedIndexInformer(lw, &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	var mu sync.Mutex
	refresh := func() {
		mu.Lock()
		defer mu.Unlock()
		var list []*discoveryv1.EndpointSlice
		for _, o := range inf.GetStore().List() {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				list = append(list, s)
			}
		}
		b.SetInstances(Instances(list, spec.Port))
	}
	h, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { refresh() },
		UpdateFunc: func(any, any) { refresh() },
		DeleteFunc: func(any) { refresh() },
	})
	if err != nil {
		w.log.Error("endpoint slice handler", "error", err)
	}
	go func() { defer close(bw.done); inf.RunWithContext(bctx) }()
	sctx, scancel := context.WithTimeout(ctx, w.o.SyncTimeout)
	defer scancel()
	if h != nil && cache.WaitForCacheSync(sctx.Done(), h.HasSynced) {
		refresh() // marks the pool synced even without any slice
		w.o.Router.UpdateReadyMetric()
		w.log.Info("instances synced", "deployment", spec.DeploymentID, "service", spec.Namespace+"/"+spec.Service, "ready", b.Pool().Ready())
	} else if ctx.Err() == nil {
		w.log.Error("instances not synced in time; switching anyway, requests get 503 until they are",
			"deployment", spec.DeploymentID, "selector", sel, "namespace", spec.Namespace, "after", w.o.SyncTimeout,
			"fix", "check that this pod may list/watch endpointslices in "+spec.Namespace)
	}
	return bw
}

// drain stops a replaced backend's watch once its last request finished.
func (w *watcher) drain(bw *backendWatch) {
	defer w.drains.Done()
	deadline := time.Now().Add(w.o.DrainTimeout)
	for bw.b.Pool().Active() > 0 && time.Now().Before(deadline) {
		select {
		case <-bw.done: // the whole watcher is stopping
			w.o.Router.Retire(bw.b)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	bw.cancel()
	<-bw.done
	w.o.Router.Retire(bw.b)
	w.log.Info("backend retired", "deployment", bw.b.Spec().DeploymentID)
}
