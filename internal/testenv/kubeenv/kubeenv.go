// Package kubeenv is this repository's Kubernetes test cluster: the public
// test environment (krane.dev/sdk/envtest: etcd, kube-apiserver,
// controller-manager, scheduler, kwok nodes) shaped like the clusters Krane
// runs in: a worker pool tainted `karpenter.sh/nodepool=untrusted` and a
// tainted `node-class=sentinel` pool in every zone, RuntimeClass `gvisor`,
// and the CiliumNetworkPolicy CRD from the cilium module.
package kubeenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/testenv"
	"krane.dev/sdk/envtest"
)

// Options shape a cluster.
type Options struct {
	// Name appears in log directory names; default "kube".
	Name string
	// Zones of the simulated nodes; default zone-a, zone-b, zone-c.
	Zones []string
	// WorkerNodesPerZone default 2; SentinelNodesPerZone default 1.
	WorkerNodesPerZone   int
	SentinelNodesPerZone int
	// WithoutCiliumCRD leaves the CiliumNetworkPolicy CRD uninstalled
	// (install it later with InstallCiliumCRD).
	WithoutCiliumCRD bool
	// WithoutEndpointSlices turns off the controllers that keep Services'
	// EndpointSlices: a test that routes to real servers of its own
	// (simulated pods serve nothing) writes the slices itself.
	WithoutEndpointSlices bool
}

// Node pool labels and taints of the simulated nodes.
const (
	LabelZone        = envtest.LabelZone
	LabelNodeClass   = "node-class"
	NodeClassWorker  = "untrusted"
	NodeClassSentry  = "sentinel"
	TaintUntrusted   = "karpenter.sh/nodepool"
	RuntimeClassName = "gvisor"
)

// Cluster is a running control plane.
type Cluster struct {
	*envtest.Cluster
}

var shared testenv.Shared[*Cluster]

// Shared returns the test package's cluster, starting it on first use; Main
// stops it.
func Shared(tb testing.TB) *Cluster {
	return shared.Get(tb, func() (*Cluster, error) {
		c, err := New(Options{})
		if err == nil {
			testenv.OnStop(c.Stop)
		}
		return c, err
	})
}

// Start starts an extra cluster that is stopped when tb's test ends (e.g. one
// per region in a multi-region test).
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// New starts a cluster. Call Stop when done.
func New(opts Options) (*Cluster, error) {
	if opts.WorkerNodesPerZone == 0 {
		opts.WorkerNodesPerZone = 2
	}
	if opts.SentinelNodesPerZone == 0 {
		opts.SentinelNodesPerZone = 1
	}
	eo := envtest.Options{Name: opts.Name, Zones: opts.Zones, NodePools: []envtest.NodePool{
		{Name: "worker", PerZone: opts.WorkerNodesPerZone, Labels: map[string]string{LabelNodeClass: NodeClassWorker},
			Taints: []corev1.Taint{{Key: TaintUntrusted, Value: NodeClassWorker, Effect: corev1.TaintEffectNoSchedule}}},
		{Name: "sentinel", PerZone: opts.SentinelNodesPerZone, Labels: map[string]string{LabelNodeClass: NodeClassSentry},
			Taints: []corev1.Taint{{Key: LabelNodeClass, Value: NodeClassSentry, Effect: corev1.TaintEffectNoSchedule}}},
	}}
	if opts.WithoutEndpointSlices {
		eo.DisabledControllers = []string{"endpointslice-controller", "endpointslice-mirroring-controller"}
	}
	if !opts.WithoutCiliumCRD {
		crd, err := ciliumCRD()
		if err != nil {
			return nil, err
		}
		eo.CRDs = append(eo.CRDs, crd)
	}
	ec, err := envtest.New(eo)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Cluster: ec}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.createRuntimeClass(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// AddNode creates one more simulated node of a node class.
func (c *Cluster) AddNode(ctx context.Context, name, zone, class string, taints ...corev1.Taint) error {
	return c.Cluster.AddNode(ctx, name, zone, map[string]string{LabelNodeClass: class}, taints...)
}

// InstallCiliumCRD installs the CiliumNetworkPolicy CRD and waits until it
// is served.
func (c *Cluster) InstallCiliumCRD(ctx context.Context) error {
	crd, err := ciliumCRD()
	if err != nil {
		return err
	}
	return c.InstallCRDs(ctx, crd)
}

func ciliumCRD() ([]byte, error) {
	p, err := CiliumCRDPath()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

func (c *Cluster) createRuntimeClass(ctx context.Context) error {
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName}, Handler: "runsc"}
	_, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create RuntimeClass %s: %w", RuntimeClassName, err)
	}
	return nil
}
