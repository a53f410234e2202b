package controller

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

func validSentinel() *clusterv1.Sentinel {
	return &clusterv1.Sentinel{
		Id: "snt_1", K8SName: "sentinel-env1", WorkspaceId: "ws_1", ProjectId: "proj_1", AppId: "app_1",
		EnvironmentId: "env_1", Image: "registry.example/unkey/sentinel:v1.2.3", Replicas: 3, CpuMillicores: 500, MemoryMib: 512,
	}
}

func defaultParams(t *testing.T) params {
	t.Helper()
	s, err := parseConfig([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return params{settings: s, Region: "eu-central-1"}
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	s, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespace != "sentinel" || s.Port != 8040 || s.GossipPort != 7946 || !s.RequireSentinelNodes ||
		s.LivenessPath != DefaultHealthPath || s.ReadinessPath != DefaultHealthPath || s.StatusResyncInterval != DefaultStatusResyncInterval {
		t.Errorf("defaults: %+v", s)
	}
	s, err = parseConfig([]byte(`{"namespace":"edge","liveness_path":"/live","readiness_path":"/ready","port":9000,"gossip_port":9001,
		"env_from_secrets":[{"name":"database"},{"name":"redis","optional":true}],"require_sentinel_nodes":false,"status_resync_interval":"2m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespace != "edge" || s.LivenessPath != "/live" || s.ReadinessPath != "/ready" || s.Port != 9000 || s.GossipPort != 9001 ||
		len(s.EnvFromSecrets) != 2 || !s.EnvFromSecrets[1].Optional || s.RequireSentinelNodes || s.StatusResyncInterval.String() != "2m0s" {
		t.Errorf("parsed: %+v", s)
	}
	for cfg, key := range map[string]string{
		`{"namespaces":"x"}`:                                   "namespaces",
		`{"namespace":"Not_A_Namespace"}`:                      "namespace",
		`{"port":"8040"}`:                                      "port",
		`{"port":70000}`:                                       "port",
		`{"gossip_port":8040}`:                                 "gossip_port",
		`{"liveness_path":"health"}`:                           "liveness_path",
		`{"readiness_path":"/a b"}`:                            "readiness_path",
		`{"env_from_secrets":[{"name":"Bad Name"}]}`:           "env_from_secrets.0.name",
		`{"env_from_secrets":[{"name":"a"},{"name":"a"}]}`:     "env_from_secrets.1.name",
		`{"env_from_secrets":[{"name":"a","optionnal":true}]}`: "optionnal",
		`{"status_resync_interval":"10ms"}`:                    "status_resync_interval",
		`{"status_resync_interval":"soon"}`:                    "status_resync_interval",
	} {
		_, err := parseConfig([]byte(cfg))
		var ce *sdk.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Error(), key) {
			t.Errorf("parseConfig(%s) = %v, want a ConfigError naming %q", cfg, err, key)
		}
		// The schema the host checks first must refuse the same blocks
		// where it can express the rule.
		if err := sdk.ValidateConfig(ConfigSchema, json.RawMessage(cfg)); err == nil && !schemaCannotExpress(key) {
			t.Errorf("schema accepts %s", cfg)
		}
	}
	if err := sdk.ValidateConfig(ConfigSchema, json.RawMessage(`{"namespace":"sentinel","env_from_secrets":[{"name":"db"}],"status_resync_interval":"1m30s"}`)); err != nil {
		t.Errorf("schema rejects a valid block: %v", err)
	}
}

// schemaCannotExpress lists the rules only Configure checks (cross-field and
// format rules beyond JSON Schema's reach).
func schemaCannotExpress(key string) bool {
	switch key {
	case "gossip_port", "readiness_path", "env_from_secrets.0.name", "env_from_secrets.1.name", "status_resync_interval":
		return true
	}
	return false
}

func TestValidate(t *testing.T) {
	if err := validate("snt_1", validSentinel()); err != nil {
		t.Fatalf("valid sentinel refused: %v", err)
	}
	for _, img := range []string{"nginx", "nginx:1.27", "ghcr.io/unkeyed/sentinel:v1", "localhost:5000/a/b_c/d-e:tag",
		"registry.example/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "[::1]:5000/x:y"} {
		s := validSentinel()
		s.Image = img
		if err := validate("snt_1", s); err != nil {
			t.Errorf("image %q refused: %v", img, err)
		}
	}
	cases := []struct {
		field  string
		mutate func(*clusterv1.Sentinel)
	}{
		{"id", func(s *clusterv1.Sentinel) { s.Id = "other" }},
		{"k8s_name", func(s *clusterv1.Sentinel) { s.K8SName = "Sentinel_1" }},
		{"k8s_name", func(s *clusterv1.Sentinel) { s.K8SName = "1sentinel" }},
		{"k8s_name", func(s *clusterv1.Sentinel) { s.K8SName = strings.Repeat("a", 57) }},
		{"workspace_id", func(s *clusterv1.Sentinel) { s.WorkspaceId = "" }},
		{"project_id", func(s *clusterv1.Sentinel) { s.ProjectId = "has space" }},
		{"app_id", func(s *clusterv1.Sentinel) { s.AppId = strings.Repeat("a", 64) }},
		{"environment_id", func(s *clusterv1.Sentinel) { s.EnvironmentId = "-env" }},
		{"image", func(s *clusterv1.Sentinel) { s.Image = "" }},
		{"image", func(s *clusterv1.Sentinel) { s.Image = "Registry/UPPER:v1" }},
		{"image", func(s *clusterv1.Sentinel) { s.Image = "nginx:latest; rm -rf /" }},
		{"image", func(s *clusterv1.Sentinel) { s.Image = "nginx@sha256:short" }},
		{"image", func(s *clusterv1.Sentinel) { s.Image = "r.example/" + strings.Repeat("a", 250) }},
		{"replicas", func(s *clusterv1.Sentinel) { s.Replicas = -1 }},
		{"replicas", func(s *clusterv1.Sentinel) { s.Replicas = MaxReplicas + 1 }},
		{"cpu_millicores", func(s *clusterv1.Sentinel) { s.CpuMillicores = 0 }},
		{"cpu_millicores", func(s *clusterv1.Sentinel) { s.CpuMillicores = MaxCPUMillicores + 1 }},
		{"memory_mib", func(s *clusterv1.Sentinel) { s.MemoryMib = -5 }},
		{"memory_mib", func(s *clusterv1.Sentinel) { s.MemoryMib = MaxMemoryMiB + 1 }},
	}
	for _, c := range cases {
		s := validSentinel()
		c.mutate(s)
		err := validate("snt_1", s)
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) || pe.Field != c.field {
			t.Errorf("%s: validate = %v, want a permanent error on field %q", c.field, err, c.field)
		}
	}
}

func TestBuildDeployment(t *testing.T) {
	p := defaultParams(t)
	p.EnvFromSecrets = []SecretRef{{Name: "database"}, {Name: "redis", Optional: true}}
	s := validSentinel()
	d := buildDeployment(s, 7, p)

	if d.Name != "sentinel-env1" || d.Namespace != "sentinel" {
		t.Errorf("name %s/%s", d.Namespace, d.Name)
	}
	if d.Annotations[kube.VersionAnnotation] != "7" || d.Annotations[kube.SpecHashAnnotation] == "" {
		t.Errorf("annotations %v", d.Annotations)
	}
	if len(d.Spec.Template.Annotations) != 0 {
		t.Errorf("pod template carries annotations %v: a version bump would roll pods", d.Spec.Template.Annotations)
	}
	for k, v := range map[string]string{kube.ManagedByLabel: "krane", kube.ComponentLabel: "sentinel", LabelWorkspace: "ws_1",
		LabelProject: "proj_1", LabelApp: "app_1", LabelEnvironment: "env_1", LabelSentinel: "snt_1"} {
		if d.Labels[k] != v || d.Spec.Template.Labels[k] != v {
			t.Errorf("label %s = %q / template %q, want %q", k, d.Labels[k], d.Spec.Template.Labels[k], v)
		}
	}
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != "RollingUpdate" || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 || d.Spec.MinReadySeconds != 5 || *d.Spec.Replicas != 3 {
		t.Errorf("strategy %+v minReady %d replicas %d", d.Spec.Strategy, d.Spec.MinReadySeconds, *d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "node-class" || pod.Tolerations[0].Value != "sentinel" || pod.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %+v", pod.Tolerations)
	}
	req := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
	if req.Key != "node-class" || req.Values[0] != "sentinel" {
		t.Errorf("node affinity %+v", req)
	}
	tsc := pod.TopologySpreadConstraints[0]
	if tsc.MaxSkew != 1 || tsc.TopologyKey != ZoneLabel || tsc.WhenUnsatisfiable != corev1.ScheduleAnyway || tsc.LabelSelector.MatchLabels[LabelSentinel] != "snt_1" {
		t.Errorf("spread %+v", tsc)
	}
	c := pod.Containers[0]
	if c.Image != s.Image || c.Ports[0].ContainerPort != 8040 || c.Ports[1].ContainerPort != 7946 || c.Ports[2].Protocol != corev1.ProtocolUDP {
		t.Errorf("container %+v", c)
	}
	if c.LivenessProbe.HTTPGet.Path != DefaultHealthPath || c.ReadinessProbe.HTTPGet.Path != DefaultHealthPath || c.LivenessProbe.HTTPGet.Port.IntValue() != 8040 {
		t.Errorf("probes %+v %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if got := c.Resources.Limits.Cpu().String(); got != "500m" || c.Resources.Requests.Cpu().String() != got {
		t.Errorf("cpu %v", c.Resources)
	}
	if got := c.Resources.Limits.Memory(); got.Cmp(resource.MustParse("512Mi")) != 0 || got.String() != "512Mi" {
		t.Errorf("memory %v", got)
	}
	if len(c.EnvFrom) != 2 || c.EnvFrom[0].SecretRef.Optional != nil || !*c.EnvFrom[1].SecretRef.Optional {
		t.Errorf("envFrom %+v", c.EnvFrom)
	}

	p.RequireSentinelNodes = false
	if buildDeployment(s, 7, p).Spec.Template.Spec.Affinity != nil {
		t.Error("require_sentinel_nodes=false still sets node affinity")
	}
	// The version is metadata only: a new version renders the same template.
	a, _ := kube.ToUnstructured(buildDeployment(s, 7, p))
	b, _ := kube.ToUnstructured(buildDeployment(s, 8, p))
	if d := kube.Drift(a.Object["spec"].(map[string]any), b.Object["spec"].(map[string]any)); d != "" {
		t.Errorf("version bump changes the Deployment spec at %s", d)
	}
}

func TestBuildPDBByReplicas(t *testing.T) {
	p := defaultParams(t)
	for replicas, want := range map[int32]string{0: "minAvailable=1", 1: "minAvailable=1", 2: "maxUnavailable=1", 5: "maxUnavailable=1"} {
		s := validSentinel()
		s.Replicas = replicas
		pdb := buildPDB(s, 1, p, nil)
		got := ""
		switch {
		case pdb.Spec.MinAvailable != nil && pdb.Spec.MaxUnavailable == nil:
			got = "minAvailable=" + pdb.Spec.MinAvailable.String()
		case pdb.Spec.MaxUnavailable != nil && pdb.Spec.MinAvailable == nil:
			got = "maxUnavailable=" + pdb.Spec.MaxUnavailable.String()
		}
		if got != want || *pdb.Spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
			t.Errorf("replicas %d: PDB %s (%v), want %s", replicas, got, pdb.Spec, want)
		}
	}
}

func TestBuildGossipPolicy(t *testing.T) {
	p := defaultParams(t)
	u, err := buildGossipPolicy(identityOf(validSentinel(), 3), p, ownerRefFromUID("sentinel-env1", "uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	if u.GetAPIVersion() != "cilium.io/v2" || u.GetKind() != "CiliumNetworkPolicy" || u.GetName() != "sentinel-env1-gossip" || u.GetNamespace() != "sentinel" {
		t.Errorf("identity %s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
	}
	if refs := u.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != "uid-1" || refs[0].Kind != "Deployment" {
		t.Errorf("owner %v", refs)
	}
	raw, _ := json.Marshal(u.Object["spec"])
	for _, want := range []string{`"enableDefaultDeny":{"egress":false,"ingress":false}`, `"port":"7946","protocol":"TCP"`, `"port":"7946","protocol":"UDP"`,
		`"unkey.com/environment.id":"env_1"`, `"fromEndpoints"`, `"toEndpoints"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("policy spec lacks %s: %s", want, raw)
		}
	}
}
