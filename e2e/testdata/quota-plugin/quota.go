package main

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Kind is the kind this plugin reconciles.
const Kind = "quota.acme.example"

const component = "acme-quota"

// Spec is one team's quota.
type Spec struct {
	Namespace string `json:"namespace"`
	CPU       string `json:"cpu,omitempty"`
	Memory    string `json:"memory,omitempty"`
	Pods      int64  `json:"pods,omitempty"`
}

// Permissions are what the plugin needs; rbac.yaml grants them.
var Permissions = []sdk.Permission{{Resource: "resourcequotas", Verbs: []string{"get", "list", "watch", "patch", "delete"}}}

var quotas = corev1.SchemeGroupVersion.WithResource("resourcequotas")

// Controller reconciles team quotas; its StatusFeed is its WatchStatus.
type Controller struct {
	*sdk.StatusFeed
	log hclog.Logger
	cur atomic.Pointer[configured]
}

type configured struct {
	client    dynamic.Interface
	quotas    *kube.Store[*corev1.ResourceQuota]
	informers *kube.Informers
}

// New returns an unconfigured controller.
func New(log hclog.Logger) *Controller {
	c := &Controller{log: log}
	c.cur.Store(&configured{})
	c.StatusFeed = sdk.NewStatusFeed(sdk.FeedOptions{Kind: Kind, Observe: c.observe, IDs: func() []string { return c.cur.Load().quotas.IDs() }})
	return c
}

func (c *Controller) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name: "quota", Version: sdk.BuildVersion(), Permissions: Permissions,
		ConfigSchema: `{"type":"object","additionalProperties":false}`,
		Kinds:        []sdk.KindInfo{{Kind: Kind, Description: "a team's ResourceQuota", SpecType: "google.protobuf.Struct", SpecSchema: specSchema}},
	}}, nil
}

func (c *Controller) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	if err := sdk.DecodeConfig(req.Config, &struct{}{}); err != nil {
		return nil, err // the plugin takes no config: every key is unknown
	}
	k, err := kube.Connect(ctx, req.Kube, Permissions)
	if err != nil {
		return nil, err
	}
	inf := kube.NewInformers()
	quotas := kube.Informer[corev1.ResourceQuota, corev1.ResourceQuotaList](inf, k, "resourcequotas", kube.InformerOptions{LabelSelector: kube.ManagedSelector(component)})
	store, err := kube.Track[*corev1.ResourceQuota](quotas, kube.IDLabel, c)
	if err != nil {
		return nil, err
	}
	if err := inf.Start(ctx, 0); err != nil {
		return nil, err
	}
	c.cur.Swap(&configured{client: k.Dynamic, quotas: store, informers: inf}).informers.Stop()
	c.ChangedAll()
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID, "version", sdk.BuildVersion())
	return &sdk.ConfigureResponse{}, nil
}

func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	cur := c.cur.Load()
	if cur.quotas == nil {
		return nil, errors.New("not configured yet")
	}
	if err := kube.ValidateID(req.ID); err != nil {
		return nil, err
	}
	if req.Deleted {
		c.Deleted(req.ID, req.Version)
		return sdk.Done(sdk.Deleted, kube.DeleteAll(ctx, cur.client, quotas, cur.quotas.Get(req.ID)))
	}
	var spec Spec
	if err := req.Spec.DecodeJSON(&spec); err != nil {
		return nil, err
	}
	q, err := build(req, spec)
	if err != nil {
		return nil, err
	}
	return sdk.Done(kube.ApplyOne(ctx, cur.client, quotas, q, cur.quotas.Get(req.ID)))
}

func (c *Controller) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	return c.cur.Load().quotas.Inventory(req.Kind), nil
}

func (c *Controller) Shutdown(context.Context) error {
	c.cur.Load().informers.Stop()
	return nil
}

// observe reports a quota's hard limits and what the namespace uses, and
// which plugin version reports it.
func (c *Controller) observe(id string) sdk.Observation {
	qs := c.cur.Load().quotas.Get(id)
	if len(qs) == 0 {
		st, _ := sdk.JSONStatus(map[string]any{"present": false})
		return sdk.Observation{Status: st, Gone: true}
	}
	q := qs[0]
	st, _ := sdk.JSONStatus(map[string]any{"present": true, "hard": q.Status.Hard, "used": q.Status.Used, "plugin_version": sdk.BuildVersion()})
	return sdk.Observation{Status: st, Version: kube.AppliedVersion(q.Annotations)}
}

// build turns a spec into the ResourceQuota, refusing quantities that do
// not parse: permanent errors that name the field.
func build(req *sdk.ApplyRequest, spec Spec) (*corev1.ResourceQuota, error) {
	if err := kube.ValidateNamespace("namespace", spec.Namespace); err != nil {
		return nil, err
	}
	hard := corev1.ResourceList{}
	for _, f := range []struct {
		field, value string
		name         corev1.ResourceName
	}{{"cpu", spec.CPU, corev1.ResourceLimitsCPU}, {"memory", spec.Memory, corev1.ResourceLimitsMemory}} {
		if f.value == "" {
			continue
		}
		qty, err := resource.ParseQuantity(f.value)
		if err != nil {
			return nil, sdk.InvalidField(f.field, "%q is not a quantity (e.g. 500m, 2, 4Gi): %v", f.value, err)
		}
		hard[f.name] = qty
	}
	if spec.Pods > 0 {
		hard[corev1.ResourcePods] = *resource.NewQuantity(spec.Pods, resource.DecimalSI)
	}
	labels := kube.ManagedLabels(component)
	labels[kube.IDLabel] = req.ID
	return &corev1.ResourceQuota{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ResourceQuota"},
		ObjectMeta: metav1.ObjectMeta{Name: "team-quota", Namespace: spec.Namespace, Labels: labels,
			Annotations: kube.VersionAnnotations(req.Version, kube.SpecHash(spec))},
		Spec: corev1.ResourceQuotaSpec{Hard: hard},
	}, nil
}
