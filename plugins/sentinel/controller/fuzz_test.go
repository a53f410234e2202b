package controller

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// FuzzSentinel feeds arbitrary desired states through the path of Apply up
// to the API server: proto encoding, Spec.Decode, validate, and every
// builder. Whatever validate accepts must build objects the API server would
// accept as far as names, labels and selectors go; whatever it refuses must
// be a permanent error naming a field. The seed corpus is in
// testdata/fuzz/FuzzSentinel; run `go test -fuzz FuzzSentinel` to explore.
func FuzzSentinel(f *testing.F) {
	f.Add("snt_1", "sentinel-env1", "ws_1", "proj_1", "app_1", "env_1", "registry.example/sentinel:v1", int32(3), int64(500), int64(512))
	f.Add("snt_2", "s", "w", "p", "a", "e", "nginx", int32(0), int64(1), int64(1))
	f.Add("", "", "", "", "", "", "", int32(-1), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, id, name, ws, project, app, env, image string, replicas int32, cpu, mem int64) {
		in := &clusterv1.Sentinel{Id: id, K8SName: name, WorkspaceId: ws, ProjectId: project, AppId: app, EnvironmentId: env,
			Image: image, Replicas: replicas, CpuMillicores: cpu, MemoryMib: mem}
		raw, err := proto.Marshal(in)
		if err != nil {
			return // invalid UTF-8 cannot travel as a proto string
		}
		spec := sdk.Spec{TypeURL: "type.googleapis.com/krane.cluster.v1.Sentinel", Value: raw}
		var s clusterv1.Sentinel
		if err := spec.Decode(&s); err != nil {
			t.Fatalf("decode of a marshalled Sentinel: %v", err)
		}
		if err := validate(id, &s); err != nil {
			var pe *sdk.PermanentError
			if !errors.As(err, &pe) || pe.Field == "" {
				t.Fatalf("validate error %v is not a permanent error naming a field", err)
			}
			return
		}
		checkBuilt(t, &s)
	})
}

func checkBuilt(t *testing.T, s *clusterv1.Sentinel) {
	p := params{settings: settings{Namespace: "sentinel", LivenessPath: "/l", ReadinessPath: "/r", Port: 8040, GossipPort: 7946, RequireSentinelNodes: true}, Region: "r"}
	owner := ownerRefFromUID(s.GetK8SName(), "uid")
	id := identityOf(s, 1)
	d := buildDeployment(s, 1, p)
	objs := []metav1.Object{d, buildService(s, 1, p, owner), buildPDB(s, 1, p, owner), buildGossipService(id, p, owner)}
	policy, err := buildGossipPolicy(id, p, owner)
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	objs = append(objs, policy)
	for _, o := range objs {
		if errs := validation.IsDNS1035Label(o.GetName()); len(errs) > 0 {
			t.Fatalf("name %q: %v", o.GetName(), errs)
		}
		checkLabels(t, o.GetLabels())
	}
	tmpl := labels.Set(d.Spec.Template.Labels)
	checkLabels(t, tmpl)
	for what, sel := range map[string]map[string]string{"pod selector": id.podSelector(), "environment selector": id.environmentSelector()} {
		if !labels.SelectorFromSet(sel).Matches(tmpl) {
			t.Fatalf("%s %v does not select the pod template %v", what, sel, tmpl)
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != s.GetImage() || *d.Spec.Replicas != s.GetReplicas() {
		t.Fatalf("image/replicas not carried over: %q %d", c.Image, *d.Spec.Replicas)
	}
	if got := c.Resources.Limits.Cpu().MilliValue(); got != s.GetCpuMillicores() {
		t.Fatalf("cpu %d millicores, want %d", got, s.GetCpuMillicores())
	}
	if got := c.Resources.Requests.Memory().Value(); got != s.GetMemoryMib()<<20 {
		t.Fatalf("memory %d bytes, want %d MiB", got, s.GetMemoryMib())
	}
	if kube.AppliedVersion(d.Annotations) != 1 || len(d.Spec.Template.Annotations) != 0 {
		t.Fatalf("annotations %v, template %v", d.Annotations, d.Spec.Template.Annotations)
	}
	// A desired object never drifts from itself: the unchanged path works.
	u, err := kube.ToUnstructured(d)
	if err != nil {
		t.Fatal(err)
	}
	if where, err := kube.DriftObject(u.Object, d); err != nil || where != "" {
		t.Fatalf("Deployment drifts from itself at %q (%v)", where, err)
	}
	// The quantities are canonical: the API server stores the same text, so
	// they never show up as drift.
	for _, q := range []*resource.Quantity{c.Resources.Limits.Cpu(), c.Resources.Limits.Memory()} {
		back, err := resource.ParseQuantity(q.String())
		if err != nil || back.String() != q.String() {
			t.Fatalf("quantity %q is not canonical (%v, %q)", q.String(), err, back.String())
		}
	}
}

func checkLabels(t *testing.T, l map[string]string) {
	t.Helper()
	for k, v := range l {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Fatalf("label key %q: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Fatalf("label %s=%q: %v", k, v, errs)
		}
	}
}
