package main

import (
	"slices"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Kind is the resource kind this plugin reconciles.
const Kind = "configmap.example.krane.dev"

// Spec is the desired state of one resource, as JSON from ctrl.
// The jsonschema tags make specSchema (schemas.go).
type Spec struct {
	Namespace string            `json:"namespace" jsonschema:"required,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$,maxLength=63"`
	Name      string            `json:"name" jsonschema:"required,minLength=1,maxLength=253"`
	Data      map[string]string `json:"data,omitempty"`
}

// Config is the plugin's `config {}` block in krane.hcl.
type Config struct {
	// AllowedNamespaces limits where ConfigMaps may be written; empty
	// allows every namespace.
	AllowedNamespaces []string `json:"allowed_namespaces,omitempty" jsonschema:"uniqueItems=true,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"`
}

// Permissions are what the plugin's identity needs: it reads its own
// ConfigMaps through an informer and writes them with server-side apply
// (create too: an apply that creates an object is checked for it).
var Permissions = []sdk.Permission{{Resource: "configmaps", Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}}}

// NewController returns the plugin's controller. Each resource is one
// ConfigMap, so kube.OneObject does the plumbing (connect and check RBAC,
// cache only our ConfigMaps, apply or answer Unchanged from the cache,
// delete, inventory, status feed); this file says what is particular to
// the kind.
func NewController(log hclog.Logger) sdk.Controller {
	return kube.NewOneObjectController(log, kube.OneObject[*corev1.ConfigMap, Spec, Config]{
		Info: sdk.Info{
			Name: "configmap", Version: sdk.BuildVersion(), ConfigSchema: configSchema, Permissions: Permissions,
			Kinds: []sdk.KindInfo{{Kind: Kind, Description: "one ConfigMap per resource (example plugin)", SpecType: "google.protobuf.Struct", SpecSchema: specSchema}},
		},
		Component: "configmap-example",
		Resource:  corev1.SchemeGroupVersion.WithResource("configmaps"),
		Informer:  kube.InformerOf[corev1.ConfigMap, corev1.ConfigMapList]("configmaps"),
		Validate:  validate,
		Build: func(s Spec, _ Config) *corev1.ConfigMap {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace}, Data: s.Data}
		},
		Status: func(cm *corev1.ConfigMap) map[string]any {
			return map[string]any{"present": true, "namespace": cm.Namespace, "name": cm.Name, "keys": len(cm.Data)}
		},
	})
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
