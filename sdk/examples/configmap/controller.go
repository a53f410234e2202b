package main

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Kind is the resource kind this plugin reconciles.
const Kind = "configmap.example.krane.dev"

const component = "configmap-example"

// Spec is the desired state of one resource, as JSON from ctrl.
type Spec struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Data      map[string]string `json:"data"`
}

// Config is the plugin's `config {}` block in krane.hcl.
type Config struct {
	// AllowedNamespaces limits where ConfigMaps may be written; empty
	// allows every namespace.
	AllowedNamespaces []string `json:"allowed_namespaces"`
}

// Permissions are what the plugin's identity needs: it reads its own
// ConfigMaps through an informer and writes them with server-side apply.
var Permissions = []sdk.Permission{{Resource: "configmaps", Verbs: []string{"get", "list", "watch", "patch", "delete"}}}

// Controller reconciles ConfigMaps from desired state. Its embedded
// StatusFeed is its WatchStatus.
type Controller struct {
	*sdk.StatusFeed
	log hclog.Logger
	cur atomic.Pointer[configured] // what the last Configure built
}

type configured struct {
	cfg       Config
	client    dynamic.Interface
	cms       *kube.Store[*corev1.ConfigMap] // our ConfigMaps, by resource id
	informers *kube.Informers
}

var configMaps = corev1.SchemeGroupVersion.WithResource("configmaps")

// NewController returns an unconfigured controller.
func NewController(log hclog.Logger) *Controller {
	c := &Controller{log: log}
	c.cur.Store(&configured{})
	c.StatusFeed = sdk.NewStatusFeed(sdk.FeedOptions{Kind: Kind, Observe: c.observe, IDs: func() []string { return c.cur.Load().cms.IDs() }})
	return c
}

func (c *Controller) Describe(context.Context) (sdk.Info, error) {
	return sdk.Info{
		Name: "configmap", Version: sdk.BuildVersion(), ConfigSchema: configSchema, Permissions: Permissions,
		Kinds: []sdk.KindInfo{{Kind: Kind, Description: "one ConfigMap per resource (example plugin)", SpecType: "google.protobuf.Struct", SpecSchema: specSchema}},
	}, nil
}

func (c *Controller) Configure(ctx context.Context, req sdk.ConfigureRequest) error {
	var cfg Config
	if err := sdk.DecodeConfig(req.Config, &cfg); err != nil {
		return err
	}
	// Connect checks Permissions first: a missing one fails here, named.
	k, err := kube.Connect(ctx, req.Kube, Permissions)
	if err != nil {
		return err
	}
	// Only our own ConfigMaps are watched: a small cache, and nothing
	// Krane does not manage is ever seen.
	inf := kube.NewInformers()
	cms, err := kube.Track[*corev1.ConfigMap](inf.Typed(k.Client, kube.ManagedSelector(component)).Core().V1().ConfigMaps().Informer(), kube.IDLabel, c)
	if err != nil {
		return err
	}
	if err := inf.Start(ctx, 0); err != nil {
		return err
	}
	c.cur.Swap(&configured{cfg: cfg, client: k.Dynamic, cms: cms, informers: inf}).informers.Stop()
	c.ChangedAll()
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID, "allowed_namespaces", cfg.AllowedNamespaces)
	return nil
}

func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	st := c.cur.Load()
	if st.cms == nil {
		return nil, errors.New("plugin not configured yet")
	}
	if err := kube.ValidateID(req.ID); err != nil {
		return nil, err
	}
	if req.Deleted {
		c.Deleted(req.ID, req.Version)
		return sdk.Done(sdk.Deleted, kube.DeleteAll(ctx, st.client, configMaps, st.cms.Get(req.ID)))
	}
	var spec Spec
	if err := req.Spec.DecodeJSON(&spec); err != nil {
		return nil, err
	}
	if err := validate(spec, st.cfg); err != nil {
		return nil, err
	}
	// Unchanged without an API call when the cache matches; a resource
	// renamed or moved leaves its old ConfigMap behind: ApplyOne removes it.
	return sdk.Done(kube.ApplyOne(ctx, st.client, configMaps, build(req, spec), st.cms.Get(req.ID)))
}

func (c *Controller) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	if req.Kind != Kind {
		return &sdk.InventoryResponse{}, nil
	}
	return c.cur.Load().cms.Inventory(Kind), nil
}

func (c *Controller) Shutdown(context.Context) error {
	c.cur.Load().informers.Stop()
	return nil
}

// observe is one resource's status: whether its ConfigMap exists, and how
// many keys it holds.
func (c *Controller) observe(id string) sdk.Observation {
	cms := c.cur.Load().cms.Get(id)
	if len(cms) == 0 {
		st, _ := sdk.JSONStatus(map[string]any{"present": false})
		return sdk.Observation{Status: st, Gone: true}
	}
	st, _ := sdk.JSONStatus(map[string]any{"present": true, "namespace": cms[0].Namespace, "name": cms[0].Name, "keys": len(cms[0].Data)})
	return sdk.Observation{Status: st, Version: kube.AppliedVersion(cms[0].Annotations)}
}

func build(req *sdk.ApplyRequest, spec Spec) *corev1.ConfigMap {
	l := kube.ManagedLabels(component)
	l[kube.IDLabel] = req.ID
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: spec.Name, Namespace: spec.Namespace, Labels: l,
			Annotations: kube.VersionAnnotations(req.Version, kube.SpecHash(spec)),
		},
		Data: spec.Data,
	}
}

func validate(s Spec, cfg Config) error {
	if err := kube.ValidateNamespace("namespace", s.Namespace); err != nil {
		return err
	}
	if len(cfg.AllowedNamespaces) > 0 && !slices.Contains(cfg.AllowedNamespaces, s.Namespace) {
		return sdk.InvalidField("namespace", "%q is not in this cluster's allowed_namespaces %v", s.Namespace, cfg.AllowedNamespaces)
	}
	if err := kube.ValidateName("name", s.Name); err != nil {
		return err
	}
	for k := range s.Data {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			return sdk.InvalidField("data", "key %q: %s", k, errs[0])
		}
	}
	return nil
}
