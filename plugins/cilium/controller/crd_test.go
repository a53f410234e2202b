package controller

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/cilium/cilium/pkg/k8s/apis/cilium.io/client"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// TestEmbeddedCRDIsCiliums: the CRD the plugin validates policies with is
// the one of the cilium module it builds against (the one cilium's own
// validator uses, and the test clusters install). After a cilium upgrade,
// copy pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnetworkpolicies.yaml
// from the module into crd/.
func TestEmbeddedCRDIsCiliums(t *testing.T) {
	var ours apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &ours); err != nil {
		t.Fatal(err)
	}
	theirs := client.GetPregeneratedCRD(slog.New(slog.DiscardHandler), client.CNPCRDName)
	if !equality.Semantic.DeepEqual(ours.Spec, theirs.Spec) {
		t.Fatal("crd/ciliumnetworkpolicies.yaml differs from the cilium module's CRD: copy the module's file into crd/")
	}
	// The plugin checks the schema without CEL (policy.go): a CRD with CEL
	// rules needs the API server's validator back.
	if bytes.Contains(crdYAML, []byte("x-kubernetes-validations")) {
		t.Fatal("the CRD has CEL rules (x-kubernetes-validations), which the plugin's schema check does not run")
	}
}
