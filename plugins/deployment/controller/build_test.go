package controller

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk/kube"
)

func validSpec() *clusterv1.Deployment {
	return &clusterv1.Deployment{
		Id: "dep_1", WorkspaceId: "ws_1", ProjectId: "proj_1", EnvironmentId: "env_1", AppId: "app_1",
		K8SNamespace: "ws-1", K8SName: "web", Image: "registry.example/team/web:v1",
		CpuMillicores: 250, MemoryMib: 256, Replicas: 3,
		EnvVars: map[string]string{"ZED": "last", "ALPHA": "first", "MIDDLE": "m"},
	}
}

func TestBuildReplicaSet(t *testing.T) {
	cfg := Defaults()
	cfg.PassEncryptedEnv = true
	d := validSpec()
	d.EncryptedEnv = []byte{0xde, 0xad, 0xbe, 0xef}
	rs := buildReplicaSet("dep_1", 7, d, cfg)

	hash := rs.Labels[LabelTemplateHash]
	if len(hash) != hashLength || rs.Name != "web-"+hash || rs.Namespace != "ws-1" {
		t.Fatalf("name %s/%s, hash %q: want ws-1/web-<hash>", rs.Namespace, rs.Name, hash)
	}
	if k8sNameOf(rs) != "web" {
		t.Errorf("k8sNameOf = %q, want web", k8sNameOf(rs))
	}
	wantLabels := map[string]string{
		kube.ManagedByLabel: "krane", kube.ComponentLabel: "deployment",
		LabelWorkspace: "ws_1", LabelProject: "proj_1", LabelEnvironment: "env_1", LabelDeployment: "dep_1", LabelApp: "app_1",
		LabelTemplateHash: hash,
	}
	for k, v := range wantLabels {
		if rs.Labels[k] != v || rs.Spec.Template.Labels[k] != v {
			t.Errorf("label %s: rs %q, template %q; want %q", k, rs.Labels[k], rs.Spec.Template.Labels[k], v)
		}
	}
	if sel := rs.Spec.Selector.MatchLabels; len(sel) != 2 || sel[LabelDeployment] != "dep_1" || sel[LabelTemplateHash] != hash {
		t.Errorf("selector %v: want deployment id and template hash", sel)
	}
	if rs.Annotations[kube.VersionAnnotation] != "7" || rs.Annotations[kube.SpecHashAnnotation] == "" {
		t.Errorf("annotations %v: want version 7 and a spec hash", rs.Annotations)
	}
	if len(rs.Spec.Template.Annotations) != 0 {
		t.Errorf("template annotations %v: the version must stay off the template", rs.Spec.Template.Annotations)
	}
	if *rs.Spec.Replicas != 3 {
		t.Errorf("replicas %d, want 3", *rs.Spec.Replicas)
	}

	pod := rs.Spec.Template.Spec
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName %v, want gvisor", pod.RuntimeClassName)
	}
	if *pod.AutomountServiceAccountToken || *pod.EnableServiceLinks {
		t.Error("service account token or service links enabled")
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "karpenter.sh/nodepool" || pod.Tolerations[0].Value != "untrusted" || pod.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %+v", pod.Tolerations)
	}
	if pod.NodeSelector["node-class"] != "untrusted" {
		t.Errorf("nodeSelector %v", pod.NodeSelector)
	}
	zone := pod.TopologySpreadConstraints[0]
	if zone.TopologyKey != "topology.kubernetes.io/zone" || zone.MaxSkew != 1 || zone.WhenUnsatisfiable != corev1.ScheduleAnyway || zone.LabelSelector.MatchLabels[LabelDeployment] != "dep_1" {
		t.Errorf("zone spread %+v", zone)
	}
	aff := pod.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	if len(aff) != 1 || aff[0].PodAffinityTerm.TopologyKey != zoneKey || aff[0].PodAffinityTerm.LabelSelector.MatchLabels[LabelEnvironment] != "env_1" ||
		aff[0].PodAffinityTerm.LabelSelector.MatchLabels[kube.ComponentLabel] != "sentinel" || !slices.Equal(aff[0].PodAffinityTerm.Namespaces, []string{"sentinel"}) {
		t.Errorf("sentinel affinity %+v", aff)
	}
	if pod.ImagePullSecrets != nil || pod.TerminationGracePeriodSeconds != nil {
		t.Errorf("pull secret %v / grace period %v set without being asked for", pod.ImagePullSecrets, pod.TerminationGracePeriodSeconds)
	}

	c := pod.Containers[0]
	if c.Image != d.Image || c.Ports[0].ContainerPort != 8080 || c.Command != nil || c.LivenessProbe != nil || c.Lifecycle != nil {
		t.Errorf("container %+v", c)
	}
	// Canonical forms, as the API server stores them.
	if c.Resources.Limits.Cpu().String() != "250m" || c.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("limits %v", c.Resources.Limits)
	}
	if !c.Resources.Requests.Cpu().Equal(*c.Resources.Limits.Cpu()) || !c.Resources.Requests.Memory().Equal(*c.Resources.Limits.Memory()) {
		t.Errorf("requests %v differ from limits %v", c.Resources.Requests, c.Resources.Limits)
	}
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	want := []string{"UNKEY_WORKSPACE_ID", "UNKEY_PROJECT_ID", "UNKEY_ENVIRONMENT_ID", "UNKEY_DEPLOYMENT_ID", "ALPHA", "MIDDLE", "ZED", "UNKEY_ENCRYPTED_ENV"}
	if !slices.Equal(names, want) {
		t.Errorf("env names %v, want %v", names, want)
	}
	if got := c.Env[len(c.Env)-1].Value; got != base64.StdEncoding.EncodeToString(d.EncryptedEnv) {
		t.Errorf("UNKEY_ENCRYPTED_ENV = %q", got)
	}
	if c.Env[3].Value != "dep_1" {
		t.Errorf("UNKEY_DEPLOYMENT_ID = %q", c.Env[3].Value)
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != secretName(d) || !strings.HasPrefix(secretName(d), "web-env-") {
		t.Errorf("envFrom %+v, want the Secret %s", c.EnvFrom, secretName(d))
	}
}

// TestSecretOptions: the Secret by default, the blob only when asked for,
// neither without secrets; the Secret's name follows the blob.
func TestSecretOptions(t *testing.T) {
	d := validSpec()
	d.EncryptedEnv = []byte("sealed")
	names := func(c corev1.Container) (env []string) {
		for _, e := range c.Env {
			env = append(env, e.Name)
		}
		return env
	}
	for _, tc := range []struct {
		name          string
		decrypt, pass bool
		sealed        []byte
		envFrom, blob bool
	}{
		{"default", true, false, d.EncryptedEnv, true, false},
		{"both", true, true, d.EncryptedEnv, true, true},
		{"pass only", false, true, d.EncryptedEnv, false, true},
		{"no secrets", true, true, nil, false, false},
	} {
		cfg := Defaults()
		cfg.DecryptEnv, cfg.PassEncryptedEnv = tc.decrypt, tc.pass
		dd := proto.Clone(d).(*clusterv1.Deployment)
		dd.EncryptedEnv = tc.sealed
		c := buildReplicaSet("dep_1", 1, dd, cfg).Spec.Template.Spec.Containers[0]
		if got := len(c.EnvFrom) == 1; got != tc.envFrom {
			t.Errorf("%s: envFrom %v", tc.name, c.EnvFrom)
		}
		if got := slices.Contains(names(c), "UNKEY_ENCRYPTED_ENV"); got != tc.blob {
			t.Errorf("%s: UNKEY_ENCRYPTED_ENV set = %v", tc.name, got)
		}
	}
	other := proto.Clone(d).(*clusterv1.Deployment)
	other.EncryptedEnv = []byte("sealed again")
	if secretName(d) == secretName(other) {
		t.Error("two blobs share a Secret name")
	}
	if a, b := buildReplicaSet("dep_1", 1, d, Defaults()), buildReplicaSet("dep_1", 1, other, Defaults()); a.Name == b.Name {
		t.Error("another blob kept the pod template")
	}
}

func TestTemplateHashTracksTheTemplateOnly(t *testing.T) {
	cfg := Defaults()
	base := buildReplicaSet("dep_1", 1, validSpec(), cfg)
	same := func(name string, mutate func(d *clusterv1.Deployment), version uint64, wantSame bool) {
		t.Helper()
		d := validSpec()
		mutate(d)
		rs := buildReplicaSet("dep_1", version, d, cfg)
		if (rs.Name == base.Name) != wantSame {
			t.Errorf("%s: name %s vs %s, want same=%v", name, rs.Name, base.Name, wantSame)
		}
	}
	same("new version", func(*clusterv1.Deployment) {}, 2, true)
	same("replicas", func(d *clusterv1.Deployment) { d.Replicas = 9 }, 2, true)
	same("env map built in another order", func(d *clusterv1.Deployment) {
		d.EnvVars = map[string]string{"MIDDLE": "m", "ZED": "last", "ALPHA": "first"}
	}, 1, true)
	same("image", func(d *clusterv1.Deployment) { d.Image = "registry.example/team/web:v2" }, 1, false)
	same("env value", func(d *clusterv1.Deployment) { d.EnvVars["ALPHA"] = "changed" }, 1, false)
	same("cpu", func(d *clusterv1.Deployment) { d.CpuMillicores = 500 }, 1, false)
	same("command", func(d *clusterv1.Deployment) { d.Command = []string{"/app", "serve"} }, 1, false)
	same("probe", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Path: "/health"} }, 1, false)
}

func TestProbes(t *testing.T) {
	cfg := Defaults()
	d := validSpec()
	d.Port = 3000
	d.Healthcheck = &clusterv1.Healthcheck{Method: "GET", Path: "/health", TimeoutSeconds: 5}
	c := buildReplicaSet("dep_1", 1, d, cfg).Spec.Template.Spec.Containers[0]
	r, l := c.ReadinessProbe, c.LivenessProbe
	if r.HTTPGet == nil || r.HTTPGet.Path != "/health" || r.HTTPGet.Port.IntValue() != 3000 {
		t.Fatalf("readiness %+v", r)
	}
	if r.TimeoutSeconds != 5 || r.PeriodSeconds != 10 || r.FailureThreshold != 3 || r.InitialDelaySeconds != 0 {
		t.Errorf("readiness timings %+v: want timeout from the spec, the rest from the defaults", r)
	}
	if l.HTTPGet.Path != "/health" || l.FailureThreshold != 6 {
		t.Errorf("liveness %+v: want the same endpoint with twice the failure threshold", l)
	}

	d.Healthcheck = &clusterv1.Healthcheck{Method: "POST", Path: "/check?deep=1", Port: 9000, PeriodSeconds: 30}
	c = buildReplicaSet("dep_1", 1, d, cfg).Spec.Template.Spec.Containers[0]
	want := []string{"wget", "-q", "-O", "/dev/null", "-T", "2", "--post-data=", "http://127.0.0.1:9000/check?deep=1"}
	if c.ReadinessProbe.Exec == nil || !slices.Equal(c.ReadinessProbe.Exec.Command, want) || c.ReadinessProbe.PeriodSeconds != 30 {
		t.Errorf("POST probe %+v, want exec %v", c.ReadinessProbe, want)
	}
}

func TestShutdownSignal(t *testing.T) {
	cfg := Defaults()
	for _, tc := range []struct {
		signal    string
		wantHook  string
		wantGrace *int64
	}{
		{"", "", nil},
		{"SIGTERM", "", nil},
		{"SIGINT", "kill -INT 1; while kill -0 1 2>/dev/null; do sleep 1; done", nil},
		{"SIGQUIT", "kill -QUIT 1; while kill -0 1 2>/dev/null; do sleep 1; done", nil},
		{"SIGKILL", "", ptr(int64(1))},
	} {
		d := validSpec()
		d.ShutdownSignal = tc.signal
		pod := buildReplicaSet("dep_1", 1, d, cfg).Spec.Template.Spec
		hook := ""
		if lc := pod.Containers[0].Lifecycle; lc != nil {
			hook = lc.PreStop.Exec.Command[2]
		}
		if hook != tc.wantHook {
			t.Errorf("%q: preStop %q, want %q", tc.signal, hook, tc.wantHook)
		}
		if (pod.TerminationGracePeriodSeconds == nil) != (tc.wantGrace == nil) ||
			tc.wantGrace != nil && *pod.TerminationGracePeriodSeconds != *tc.wantGrace {
			t.Errorf("%q: grace period %v, want %v", tc.signal, pod.TerminationGracePeriodSeconds, tc.wantGrace)
		}
	}
}

// TestTerminationGracePeriod: the workload's grace period is the pod's;
// 0 leaves Kubernetes' default; SIGKILL keeps its 1 s.
func TestTerminationGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		grace     int32
		signal    string
		wantGrace *int64
	}{
		{0, "", nil},
		{45, "", ptr(int64(45))},
		{45, "SIGINT", ptr(int64(45))},
		{45, "SIGKILL", ptr(int64(1))},
	} {
		d := validSpec()
		d.Workload = workloadOf(d)
		d.Workload.TerminationGracePeriodSeconds, d.Workload.ShutdownSignal = tc.grace, tc.signal
		pod := buildReplicaSet("dep_1", 1, d, Defaults()).Spec.Template.Spec
		if (pod.TerminationGracePeriodSeconds == nil) != (tc.wantGrace == nil) ||
			tc.wantGrace != nil && *pod.TerminationGracePeriodSeconds != *tc.wantGrace {
			t.Errorf("grace %d, %q: the pod's grace period is %v, want %v", tc.grace, tc.signal, pod.TerminationGracePeriodSeconds, tc.wantGrace)
		}
	}
}

func TestConfigShapesThePod(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{
		"runtime_class": "",
		"image_pull_secret": "registry",
		"node_selector": {},
		"tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoExecute"}],
		"env_var_names": {"deployment_id": "APP_DEPLOYMENT"},
		"sentinel_namespace": "edge"
	}`))
	if err != nil {
		t.Fatal(err)
	}
	pod := buildReplicaSet("dep_1", 1, validSpec(), cfg).Spec.Template.Spec
	if pod.RuntimeClassName != nil || pod.NodeSelector != nil {
		t.Errorf("runtime class %v, node selector %v: want none", pod.RuntimeClassName, pod.NodeSelector)
	}
	if len(pod.ImagePullSecrets) != 1 || pod.ImagePullSecrets[0].Name != "registry" {
		t.Errorf("image pull secrets %v", pod.ImagePullSecrets)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "pool" || pod.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations %+v: want the configured list only", pod.Tolerations)
	}
	env := pod.Containers[0].Env
	if env[3].Name != "APP_DEPLOYMENT" || env[0].Name != "UNKEY_WORKSPACE_ID" {
		t.Errorf("env names %s, %s: want one override, the rest default", env[3].Name, env[0].Name)
	}
	if ns := pod.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.Namespaces; !slices.Equal(ns, []string{"edge"}) {
		t.Errorf("sentinel namespaces %v", ns)
	}
}

func TestSpecHashIsStable(t *testing.T) {
	a, b := validSpec(), proto.Clone(validSpec()).(*clusterv1.Deployment)
	if specHash(a) != specHash(b) {
		t.Error("equal specs hash differently")
	}
	b.Replicas++
	if specHash(a) == specHash(b) {
		t.Error("different specs hash alike")
	}
}

func TestPullSecretsPerRegistry(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{
		"image_pull_secret": "everywhere",
		"image_pull_secrets": {"Registry.Example": "build-registry", "localhost:5000": "local", "docker.io": "hub"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for image, want := range map[string][]string{
		"registry.example/team/web:v1":                                {"build-registry", "everywhere"},
		"REGISTRY.example/team/web@sha256:" + strings.Repeat("a", 64): {"build-registry", "everywhere"},
		"localhost:5000/web":                                          {"local", "everywhere"},
		"nginx:1.27":                                                  {"hub", "everywhere"},
		"library/nginx":                                               {"hub", "everywhere"},
		"ghcr.io/team/api:v2":                                         {"everywhere"},
	} {
		d := validSpec()
		d.Image = image
		var got []string
		for _, s := range buildReplicaSet("dep_1", 1, d, cfg).Spec.Template.Spec.ImagePullSecrets {
			got = append(got, s.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: pull secrets %v, want %v", image, got, want)
		}
	}
	// Without any, a pod names none.
	if s := buildReplicaSet("dep_1", 1, validSpec(), Defaults()).Spec.Template.Spec.ImagePullSecrets; s != nil {
		t.Errorf("pull secrets %v without config, want none", s)
	}
}
