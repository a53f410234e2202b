package controller

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/cilium/pkg/defaults"
	"github.com/cilium/cilium/pkg/fqdn/re"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"github.com/cilium/cilium/pkg/labels"
	"github.com/cilium/cilium/pkg/logging"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Labels Krane puts on every policy besides kube.ManagedLabels.
const (
	// Component is the value of kube.ComponentLabel on this plugin's
	// policies. Other plugins' policies (the sentinel's gossip policy)
	// carry other components, so this plugin never lists or deletes them.
	Component = "ciliumnetworkpolicy"
	// IDLabel carries ctrl's policy id.
	IDLabel = "unkey.com/networkpolicy.id"
)

// GVR is the resource every policy is applied to.
var GVR = schema.GroupVersionResource{Group: "cilium.io", Version: ciliumv2.CustomResourceDefinitionVersion, Resource: "ciliumnetworkpolicies"}

var apiVersion = GVR.GroupVersion().String()

// objectKeys are the top-level keys of the full object form of the policy
// JSON; the spec-only form (an api.Rule) has none of them.
var objectKeys = []string{"apiVersion", "kind", "metadata", "spec", "specs", "status"}

// metadataKeys may appear in the JSON's metadata. Krane overrides all of
// them; anything else there (uid, resourceVersion, ownerReferences,
// finalizers...) would change how the object is written, so it is refused.
var metadataKeys = []string{"name", "namespace", "labels", "annotations", "creationTimestamp"}

// Desired is a validated policy, ready to apply.
type Desired struct {
	// Object is the CiliumNetworkPolicy as applied with server-side apply
	// and compared with the live object.
	Object *unstructured.Unstructured
	// SpecHash is kube.SpecHash of the namespace, name and rules.
	SpecHash string
}

// Build validates ctrl's policy for the object id at version and builds the
// object to apply. It is pure: no cluster, no clock. Every error is a
// permanent [*sdk.PermanentError] whose Field names what is wrong ("id",
// "k8s_namespace", "k8s_name", "policy" or a path inside the policy such as
// "policy.spec.ingress[0].fromEndpoints[0]"); paths inside the policy are
// those of the full object form, whichever form ctrl sent.
func Build(pb *clusterv1.CiliumNetworkPolicy, id string, version uint64, cfg Config) (*Desired, error) {
	if id == "" {
		return nil, sdk.InvalidField("id", "empty: every policy needs ctrl's id")
	}
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
		return nil, sdk.InvalidField("id", "%q is not usable as the %s label value: %s", id, IDLabel, errs[0])
	}
	if pb.GetId() != "" && pb.GetId() != id {
		return nil, sdk.InvalidField("id", "the spec says %q but the change is for %q", pb.GetId(), id)
	}
	ns, name := pb.GetK8SNamespace(), pb.GetK8SName()
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, sdk.InvalidField("k8s_namespace", "%q is not a namespace name: %s", ns, errs[0])
	}
	if !cfg.NamespaceAllowed(ns) {
		return nil, sdk.InvalidField("k8s_namespace", "namespace %q is not allowed for network policies on this cluster (%s); ask the cluster admin to allow it in the cilium plugin's config", ns, cfg.describeAllowed())
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, sdk.InvalidField("k8s_name", "%q is not an object name: %s", name, errs[0])
	}
	cnp, err := Parse(pb.GetPolicy(), ns, name, cfg)
	if err != nil {
		return nil, err
	}
	return build(id, version, cnp)
}

// Parse decodes the policy JSON into cilium's own types and validates it
// the way cilium does, plus Krane's namespace rules (see scope.go). The
// JSON is either a full CiliumNetworkPolicy object or just its spec (an
// api.Rule). Name and namespace are set to name and ns whatever the JSON
// says. The result is as ctrl wrote it: cilium's sanitisation runs on a
// copy, because it rewrites label keys into its internal form.
func Parse(raw []byte, ns, name string, cfg Config) (_ *ciliumv2.CiliumNetworkPolicy, err error) {
	// cilium's decoders trust their input more than ctrl's JSON deserves:
	// an ICMP field without "type" makes ICMPField.UnmarshalJSON
	// dereference nil (found by FuzzPolicy). Such a policy is refused like
	// any other invalid one instead of failing as a retryable panic.
	defer func() {
		if r := recover(); r != nil {
			err = invalidPolicy("cilium's code panicked while checking it (%v): refused as invalid", r)
		}
	}()
	limit := cfg.MaxPolicyBytes
	if limit <= 0 {
		limit = DefaultMaxPolicyBytes
	}
	if len(raw) > limit {
		return nil, sdk.InvalidField("policy", "%d bytes, more than max_policy_bytes (%d): split it into several policies or raise the limit in the plugin's config", len(raw), limit)
	}
	schema, err := cnpSchemas()
	if err != nil {
		// The schemas come from the CRD compiled into this binary: failing
		// here is a bug, not the policy's fault, so retry.
		return nil, fmt.Errorf("CiliumNetworkPolicy schema: %w", err)
	}
	object, err := canonical(raw, ns, name)
	if err != nil {
		return nil, err
	}

	// Strict decoding: case-sensitive, no unknown or duplicate fields, so
	// a misspelt key cannot silently turn a rule into a different one.
	cnp := &ciliumv2.CiliumNetworkPolicy{}
	strict, err := kjson.UnmarshalStrict(object, cnp, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, invalidPolicy("does not decode as a CiliumNetworkPolicy: %v", err)
	}
	if len(strict) > 0 {
		return nil, invalidPolicy("%v", errors.Join(strict...))
	}
	if cnp.Spec == nil && len(cnp.Specs) == 0 {
		return nil, invalidPolicy("has no rules: set spec (or specs) with an endpointSelector and ingress or egress rules")
	}

	// The decoder above cannot see inside selectors, rule labels and ICMP
	// fields: cilium decodes those with lenient custom decoders. The CRD's
	// structural schema can: any field it does not know is one the API
	// server would silently drop.
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(object); err != nil {
		return nil, invalidPolicy("%v", err)
	}
	if unknown := schema.unknownFields(u.Object); len(unknown) > 0 {
		return nil, sdk.InvalidField("policy."+unknown[0], "unknown field (the API server would drop it silently); all unknown fields: %s", strings.Join(unknown, ", "))
	}

	// What cilium's validator (pkg/k8s/apis/cilium.io/v2/validator) checks
	// besides unknown fields, which the checks above cover more strictly:
	// the CRD's OpenAPI schema (what the API server enforces), and that no
	// rule selects reserved:init, which only clusterwide policies may.
	if res := schema.validator.Validate(u.Object); !res.IsValid() {
		return nil, invalidPolicy("rejected by the CiliumNetworkPolicy schema: %v", errors.Join(res.Errors...))
	}
	if err := noInitSelector(cnp); err != nil {
		return nil, invalidPolicy("rejected by cilium's validator: %v", err)
	}

	// cilium's agent entry point: Sanitize() on every rule, then the
	// translation that scopes selectors to the policy's namespace.
	sanitized := cnp.DeepCopy()
	if _, err := sanitized.Parse(discardLogger, ""); err != nil {
		return nil, invalidPolicy("rejected by cilium: %v", err)
	}
	sc := scope{own: ns, peers: cfg.AllowedPeerNamespaces}
	if err := sc.check(sanitized); err != nil {
		return nil, err
	}
	return cnp, nil
}

// canonical turns either form of the policy JSON into a full object with
// Krane's name and namespace and nothing else in its metadata.
func canonical(raw []byte, ns, name string) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, sdk.InvalidField("policy", "empty: want a CiliumNetworkPolicy object or its spec as JSON")
	}
	var top map[string]json.RawMessage
	strict, err := kjson.UnmarshalStrict(raw, &top, kjson.DisallowDuplicateFields)
	if err != nil || top == nil {
		return nil, sdk.InvalidField("policy", "not a JSON object: want a CiliumNetworkPolicy object or its spec: %v", errOrNull(err))
	}
	if len(strict) > 0 {
		return nil, invalidPolicy("%v", errors.Join(strict...))
	}
	meta := map[string]string{"name": name, "namespace": ns}
	out := map[string]any{"apiVersion": apiVersion, "kind": ciliumv2.CNPKindDefinition, "metadata": meta}
	if !slices.ContainsFunc(objectKeys, func(k string) bool { _, ok := top[k]; return ok }) {
		out["spec"] = json.RawMessage(raw) // spec-only form
		return json.Marshal(out)
	}
	for k, v := range top {
		switch k {
		case "apiVersion":
			var s string
			if err := json.Unmarshal(v, &s); err != nil || s != apiVersion {
				return nil, sdk.InvalidField("policy.apiVersion", "%s: want %q", v, apiVersion)
			}
		case "kind":
			if err := checkKind(v); err != nil {
				return nil, err
			}
		case "metadata":
			if err := checkMetadata(v); err != nil {
				return nil, err
			}
		case "status":
			if s := string(bytes.TrimSpace(v)); s != "{}" && s != "null" {
				return nil, sdk.InvalidField("policy.status", "must be empty: cilium writes a policy's status, ctrl does not")
			}
		case "spec", "specs":
			out[k] = v
		default:
			return nil, sdk.InvalidField("policy."+k, "unknown field of a CiliumNetworkPolicy (a description belongs in spec.description)")
		}
	}
	return json.Marshal(out)
}

func checkKind(v json.RawMessage) error {
	var kind string
	if err := json.Unmarshal(v, &kind); err != nil {
		return sdk.InvalidField("policy.kind", "%s is not a string", v)
	}
	switch kind {
	case ciliumv2.CNPKindDefinition:
		return nil
	case ciliumv2.CCNPKindDefinition:
		return sdk.InvalidField("policy.kind", "%s is not supported: Krane applies only namespaced CiliumNetworkPolicies, clusterwide policies belong to the cluster admin", kind)
	}
	return sdk.InvalidField("policy.kind", "%q: want %q", kind, ciliumv2.CNPKindDefinition)
}

func checkMetadata(v json.RawMessage) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(v, &keys); err != nil {
		return sdk.InvalidField("policy.metadata", "not an object: %v", err)
	}
	for k := range keys {
		if !slices.Contains(metadataKeys, k) {
			return sdk.InvalidField("policy.metadata."+k, "not allowed: Krane owns the object's metadata (name, namespace, labels and annotations are set by Krane, anything else is refused)")
		}
	}
	// The allowed keys are overridden, but must still be well-typed.
	var om metav1.ObjectMeta
	if _, err := kjson.UnmarshalStrict(v, &om); err != nil {
		return sdk.InvalidField("policy.metadata", "%v", err)
	}
	if !om.CreationTimestamp.IsZero() {
		return sdk.InvalidField("policy.metadata.creationTimestamp", "set by the API server, not by ctrl")
	}
	return nil
}

// build turns a validated policy into the object to apply.
func build(id string, version uint64, cnp *ciliumv2.CiliumNetworkPolicy) (*Desired, error) {
	obj := &ciliumv2.CiliumNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiVersion, Kind: ciliumv2.CNPKindDefinition},
		ObjectMeta: metav1.ObjectMeta{Name: cnp.Name, Namespace: cnp.Namespace},
		Spec:       cnp.Spec,
		Specs:      cnp.Specs,
	}
	// Not kube.ToUnstructured: it prunes empty maps, and an empty
	// endpointSelector ({}: every pod of the namespace) is meaningful.
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, invalidPolicy("re-encode: %v", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, invalidPolicy("re-encode: %v", err)
	}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	hash := kube.SpecHash(map[string]any{"namespace": cnp.Namespace, "name": cnp.Name, "spec": u.Object["spec"], "specs": u.Object["specs"]})

	l := kube.ManagedLabels(Component)
	l[IDLabel] = id
	u.SetLabels(l)
	u.SetAnnotations(kube.VersionAnnotations(version, hash))
	return &Desired{Object: u, SpecHash: hash}, nil
}

func invalidPolicy(format string, args ...any) error {
	return sdk.InvalidField("policy", format, args...)
}

func errOrNull(err error) error {
	if err == nil {
		return errors.New("got null")
	}
	return err
}

// noInitSelector refuses a rule that selects endpoints by reserved:init,
// as cilium's validator does: only a CiliumClusterwideNetworkPolicy may
// (cilium's message says why).
func noInitSelector(cnp *ciliumv2.CiliumNetworkPolicy) error {
	init := labels.LabelSourceReservedKeyPrefix + labels.IDNameInit
	for _, r := range append(slices.Clone(cnp.Specs), cnp.Spec) {
		if r == nil {
			continue
		}
		sel := r.EndpointSelector.DeepCopy()
		if err := sel.Sanitize(); err != nil {
			return err
		}
		if sel.HasKey(init) {
			return errors.New("CiliumNetworkPolicy incorrectly matches reserved:init label: a policy for endpoints before they receive their identity must be a CiliumClusterwideNetworkPolicy")
		}
	}
	return nil
}

// crdYAML is the CiliumNetworkPolicy CRD of the cilium module this plugin
// builds against (cilium's pkg/k8s/apis/cilium.io/client/crds, Apache 2.0;
// TestEmbeddedCRDIsCiliums keeps the copy current). Reading it here rather
// than through cilium's client package keeps that package, and the
// clientsets, CRD client and CEL libraries it links, out of the plugin.
//
//go:embed crd/ciliumnetworkpolicies.yaml
var crdYAML []byte

// schemas are what the CRD's schema checks a policy with.
type schemas struct {
	structural *structuralschema.Structural
	validator  *validate.SchemaValidator
}

// unknownFields returns the paths of the fields of obj that the schema
// does not know.
func (s *schemas) unknownFields(obj map[string]any) []string {
	opts := structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}
	return pruning.PruneWithOptions(runtime.DeepCopyJSON(obj), s.structural, true, opts)
}

// cnpSchemas are built once from crdYAML. Building them also sets up,
// once per process, what the cilium agent sets up at start and its policy
// code relies on.
var cnpSchemas = sync.OnceValues(func() (*schemas, error) {
	// cilium's package-level logger repeats at error level problems that
	// its functions also return; they reach the operator as Apply errors.
	logging.DefaultSlogLogger = discardLogger
	// toFQDNs rules with a matchPattern are compiled through this cache.
	if err := re.InitRegexCompileLRU(discardLogger, defaults.FQDNRegexCompileLRUSize); err != nil {
		return nil, err
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		return nil, err
	}
	var internal apiextensions.CustomResourceValidation
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(crd.Spec.Versions[0].Schema, &internal, nil); err != nil {
		return nil, err
	}
	structural, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, err
	}
	// The structural schema keeps every value validation of the CRD
	// (types, formats, enums, patterns, bounds); kube-openapi checks them
	// as the API server does, without the CEL rules this CRD has none of.
	validator := validate.NewSchemaValidator(structural.ToKubeOpenAPI(), nil, "", strfmt.Default)
	return &schemas{structural: structural, validator: validator}, nil
})

// discardLogger silences cilium's own warnings: every problem it finds is
// returned as an error and reported upstream instead.
var discardLogger = slog.New(slog.DiscardHandler)

// describe a set of namespaces for messages.
func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}
