package envtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// InstallCRDs applies a manifest of CustomResourceDefinitions and waits
// until every one of them is established and served.
func (c *Cluster) InstallCRDs(ctx context.Context, manifest []byte) error {
	if err := c.ApplyYAML(ctx, manifest); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	crds := c.Dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("decode CRD manifest: %w", err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
		versions, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
		for {
			crd, err := crds.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err == nil && crdEstablished(crd) && served(c, group, versions) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", obj.GetName(), ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// served reports whether discovery lists every version of a CRD's group
// (Established can precede discovery by a moment).
func served(c *Cluster, group string, versions []any) bool {
	for _, v := range versions {
		m, _ := v.(map[string]any)
		name, _ := m["name"].(string)
		if _, err := c.Client.Discovery().ServerResourcesForGroupVersion(group + "/" + name); err != nil {
			return false
		}
	}
	return true
}

func crdEstablished(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// ApplyYAML server-side applies every object of a multi-document YAML
// manifest as the admin (field manager "testenv").
func (c *Cluster) ApplyYAML(ctx context.Context, manifest []byte) error {
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decode manifest: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("map %s: %w", gvk, err)
		}
		res := c.Dynamic.Resource(mapping.Resource)
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{FieldManager: "testenv", Force: ptr(true)}
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			_, err = res.Namespace(ns).Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
		} else {
			_, err = res.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
		}
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
}

// EnsureNamespace creates a namespace if it does not exist.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ServiceAccountConfig creates ServiceAccount namespace/name when missing,
// mints a token for it, and returns a client config and a kubeconfig file
// that authenticate as it. What it may do is decided by RBAC alone.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, string, error) {
	if err := c.EnsureNamespace(ctx, namespace); err != nil {
		return nil, "", err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := c.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, "", fmt.Errorf("create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	expiry := int64(24 * 3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("mint token for %s/%s: %w", namespace, name, err)
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.BearerToken = tr.Status.Token
	path := filepath.Join(c.dir, fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	if err := writeKubeconfigFile(path, c.url, c.Config.CAData, namespace+"-"+name, tr.Status.Token); err != nil {
		return nil, "", err
	}
	return cfg, path, nil
}

func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // readiness probe of a local test server

func ptr[T any](v T) *T { return &v }
