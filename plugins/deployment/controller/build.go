package controller

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk/kube"
)

// Labels of the seeds, on the ReplicaSet and its pods.
const (
	LabelWorkspace   = "unkey.com/workspace.id"
	LabelProject     = "unkey.com/project.id"
	LabelApp         = "unkey.com/app.id"
	LabelEnvironment = "unkey.com/environment.id"
	LabelDeployment  = "unkey.com/deployment.id"
	// LabelTemplateHash tells the pod templates of one deployment apart:
	// it is part of the ReplicaSet's name and selector.
	LabelTemplateHash = "krane.dev/template-hash"

	// Component is the app.kubernetes.io/component of everything this
	// plugin writes.
	Component = "deployment"
	// SentinelComponent selects the environment's sentinel pods.
	SentinelComponent = "sentinel"

	containerName = "deployment"
	portName      = "http"
	defaultPort   = 8080
	zoneKey       = "topology.kubernetes.io/zone"
	hostnameKey   = "kubernetes.io/hostname"
	hashLength    = 10
)

// BuildReplicaSet is the ReplicaSet the plugin applies for a validated
// Deployment at a version, under cfg (benchmarks compare the plugin's
// apply path with raw server-side apply of exactly these objects).
func BuildReplicaSet(id string, version uint64, d *clusterv1.Deployment, cfg Config) *appsv1.ReplicaSet {
	return buildReplicaSet(id, version, d, cfg)
}

// buildReplicaSet returns the ReplicaSet of one validated Deployment. It is
// pure: the same input always gives the same object, which is what lets the
// drift check compare it with the live copy.
func buildReplicaSet(id string, version uint64, d *clusterv1.Deployment, cfg Config) *appsv1.ReplicaSet {
	labels := podLabels(id, d)
	template := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       buildPodSpec(id, d, workloadOf(d), cfg),
	}
	// The hash covers the whole template but not the version, so a new
	// version with the same workload keeps its pods.
	hash := kube.SpecHash(template)[:hashLength]
	template.Labels = withLabel(labels, LabelTemplateHash, hash)
	return &appsv1.ReplicaSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        replicaSetName(d.GetK8SName(), hash),
			Namespace:   d.GetK8SNamespace(),
			Labels:      withLabel(labels, LabelTemplateHash, hash),
			Annotations: kube.VersionAnnotations(version, specHash(d)),
		},
		Spec: appsv1.ReplicaSetSpec{
			Replicas:        ptr(d.GetReplicas()),
			MinReadySeconds: cfg.MinReadySeconds,
			Selector:        &metav1.LabelSelector{MatchLabels: map[string]string{LabelDeployment: id, LabelTemplateHash: hash}},
			Template:        template,
		},
	}
}

func replicaSetName(k8sName, hash string) string { return k8sName + "-" + hash }

// k8sNameOf recovers the deployment's k8s_name from its ReplicaSet.
func k8sNameOf(rs *appsv1.ReplicaSet) string {
	hash := rs.Labels[LabelTemplateHash]
	if n := len(rs.Name) - len(hash) - 1; hash != "" && n > 0 && rs.Name[n:] == "-"+hash {
		return rs.Name[:n]
	}
	return rs.Name
}

func podLabels(id string, d *clusterv1.Deployment) map[string]string {
	l := kube.ManagedLabels(Component)
	l[LabelWorkspace] = d.GetWorkspaceId()
	l[LabelProject] = d.GetProjectId()
	l[LabelEnvironment] = d.GetEnvironmentId()
	l[LabelDeployment] = id
	if d.GetAppId() != "" {
		l[LabelApp] = d.GetAppId()
	}
	return l
}

func buildPodSpec(id string, d *clusterv1.Deployment, w *clusterv1.Workload, cfg Config) corev1.PodSpec {
	spec := corev1.PodSpec{
		Containers:    []corev1.Container{buildContainer(id, d, w, cfg)},
		RestartPolicy: corev1.RestartPolicyAlways,
		// User code gets no API credentials and no view of cluster services.
		AutomountServiceAccountToken: ptr(false),
		EnableServiceLinks:           ptr(false),
		NodeSelector:                 maps.Clone(cfg.NodeSelector),
		Tolerations:                  cfg.tolerations(),
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{
			spread(zoneKey, id), spread(hostnameKey, id),
		},
		Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 100,
				PodAffinityTerm: corev1.PodAffinityTerm{
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
						kube.ComponentLabel: SentinelComponent,
						LabelEnvironment:    d.GetEnvironmentId(),
					}},
					Namespaces:  []string{cfg.SentinelNamespace},
					TopologyKey: zoneKey,
				},
			}},
		}},
	}
	if len(spec.NodeSelector) == 0 {
		spec.NodeSelector = nil
	}
	if cfg.RuntimeClass != "" {
		spec.RuntimeClassName = ptr(cfg.RuntimeClass)
	}
	spec.ImagePullSecrets = pullSecrets(w.GetImage(), cfg)
	if g := w.GetTerminationGracePeriodSeconds(); g > 0 {
		spec.TerminationGracePeriodSeconds = ptr(int64(g))
	}
	// A signal to PID 1 from inside its own PID namespace is dropped unless
	// the process handles it, and SIGKILL cannot be handled: a preStop
	// `kill -KILL 1` would do nothing. The kubelet's own SIGKILL after the
	// grace period does the job, so the grace period becomes 1s.
	if w.GetShutdownSignal() == "SIGKILL" {
		spec.TerminationGracePeriodSeconds = ptr(int64(1))
	}
	return spec
}

// pullSecrets are the Secrets a pod of image pulls with: its registry's
// (image_pull_secrets), then the one for every image (image_pull_secret).
func pullSecrets(image string, cfg Config) []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	if name, ok := cfg.ImagePullSecrets[RegistryOf(image)]; ok {
		out = append(out, corev1.LocalObjectReference{Name: name})
	}
	if cfg.ImagePullSecret != "" && !slices.ContainsFunc(out, func(r corev1.LocalObjectReference) bool { return r.Name == cfg.ImagePullSecret }) {
		out = append(out, corev1.LocalObjectReference{Name: cfg.ImagePullSecret})
	}
	return out
}

// RegistryOf is the registry host of an image reference, the way container
// runtimes read it: the first path component when it has a dot or a port
// or is "localhost", else Docker Hub ("docker.io").
func RegistryOf(image string) string {
	first, _, found := strings.Cut(image, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return strings.ToLower(first)
	}
	return "docker.io"
}

func spread(topologyKey, id string) corev1.TopologySpreadConstraint {
	return corev1.TopologySpreadConstraint{
		MaxSkew:           1,
		TopologyKey:       topologyKey,
		WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{LabelDeployment: id}},
	}
}

func buildContainer(id string, d *clusterv1.Deployment, w *clusterv1.Workload, cfg Config) corev1.Container {
	port := containerPort(w)
	// Canonical quantities: the API server stores "250m" and "256Mi" as
	// built here, so the drift check sees no difference where there is none.
	cpu := *resource.NewMilliQuantity(w.GetCpuMillicores(), resource.DecimalSI)
	mem := *resource.NewQuantity(w.GetMemoryMib()*1024*1024, resource.BinarySI)
	// Requests equal limits: the scheduler places what the workload may use,
	// and the pod gets the Guaranteed QoS class (last to be evicted).
	res := corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem}
	c := corev1.Container{
		Name:            containerName,
		Image:           w.GetImage(),
		Command:         slices.Clone(w.GetCommand()),
		ImagePullPolicy: corev1.PullIfNotPresent,
		Ports:           []corev1.ContainerPort{{Name: portName, ContainerPort: port}},
		Env:             buildEnv(id, d, w, cfg),
		EnvFrom:         buildEnvFrom(d, cfg),
		Resources:       corev1.ResourceRequirements{Limits: res, Requests: res.DeepCopy()},
		// The last log lines become the crash message the status reports.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if len(c.Command) == 0 {
		c.Command = nil
	}
	if hc := w.GetHealthcheck(); hc != nil {
		c.ReadinessProbe, c.LivenessProbe = buildProbes(hc, port, cfg.ProbeDefaults)
	}
	if sig, ok := shutdownSignals[w.GetShutdownSignal()]; ok && sig != "TERM" && sig != "KILL" {
		// The kubelet sends SIGTERM when the hook returns, so the hook waits
		// for PID 1 to exit (or for the grace period to end) after sending
		// the workload's own signal. Needs /bin/sh in the image.
		c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
			Command: []string{"/bin/sh", "-c", "kill -" + sig + " 1; while kill -0 1 2>/dev/null; do sleep 1; done"},
		}}}
	}
	return c
}

func containerPort(w *clusterv1.Workload) int32 {
	if p := w.GetPort(); p > 0 {
		return p
	}
	return defaultPort
}

// buildEnv returns Krane's variables, then the spec's sorted by name (a
// map has no order, and a reordered list would be a template change), then
// the sealed blob when pass_encrypted_env asks for it.
func buildEnv(id string, d *clusterv1.Deployment, w *clusterv1.Workload, cfg Config) []corev1.EnvVar {
	names := cfg.EnvVarNames
	env := []corev1.EnvVar{
		{Name: names.WorkspaceID, Value: d.GetWorkspaceId()},
		{Name: names.ProjectID, Value: d.GetProjectId()},
		{Name: names.EnvironmentID, Value: d.GetEnvironmentId()},
		{Name: names.DeploymentID, Value: id},
	}
	for _, name := range slices.Sorted(maps.Keys(w.GetEnvVars())) {
		env = append(env, corev1.EnvVar{Name: name, Value: w.GetEnvVars()[name]})
	}
	if sealed := d.GetEncryptedEnv(); len(sealed) > 0 && cfg.PassEncryptedEnv {
		env = append(env, corev1.EnvVar{Name: names.EncryptedEnv, Value: base64.StdEncoding.EncodeToString(sealed)})
	}
	return env
}

// buildEnvFrom injects the opened secret environment from its Secret.
// Variables set in env win over it (Kubernetes' rule), so a secret can
// never replace one of Krane's own.
func buildEnvFrom(d *clusterv1.Deployment, cfg Config) []corev1.EnvFromSource {
	if !cfg.DecryptEnv || len(d.GetEncryptedEnv()) == 0 {
		return nil
	}
	return []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: secretName(d)}}}}
}

// secretName names the Secret holding a deployment's opened environment:
// the workload's name and a hash of the sealed blob, so a pod template only
// ever refers to the content it was built for.
func secretName(d *clusterv1.Deployment) string {
	sum := sha256.Sum256(d.GetEncryptedEnv())
	return d.GetK8SName() + "-env-" + hex.EncodeToString(sum[:])[:hashLength]
}

// buildProbes maps the healthcheck to a readiness and a liveness probe on
// the same endpoint. Liveness tolerates twice as many failures: a slow
// instance is first taken out of rotation, and restarted only if it stays
// unhealthy.
func buildProbes(hc *clusterv1.Healthcheck, port int32, def ProbeDefaults) (readiness, liveness *corev1.Probe) {
	or := func(v, d int32) int32 {
		if v > 0 {
			return v
		}
		return d
	}
	probePort := port
	if hc.GetPort() > 0 {
		probePort = hc.GetPort()
	}
	timeout := or(hc.GetTimeoutSeconds(), def.TimeoutSeconds)
	handler := corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: hc.GetPath(), Port: intstr.FromInt32(probePort)}}
	if hc.GetMethod() == "POST" {
		// The kubelet's HTTP probe only sends GET. A POST check runs wget in
		// the container (BusyBox and GNU wget both accept these flags), so
		// the image must ship wget.
		handler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{
			"wget", "-q", "-O", "/dev/null", "-T", strconv.Itoa(int(timeout)), "--post-data=",
			"http://127.0.0.1:" + strconv.Itoa(int(probePort)) + hc.GetPath(),
		}}}
	}
	readiness = &corev1.Probe{
		ProbeHandler:        handler,
		InitialDelaySeconds: or(hc.GetInitialDelaySeconds(), def.InitialDelaySeconds),
		PeriodSeconds:       or(hc.GetPeriodSeconds(), def.PeriodSeconds),
		TimeoutSeconds:      timeout,
		FailureThreshold:    or(hc.GetFailureThreshold(), def.FailureThreshold),
	}
	liveness = readiness.DeepCopy()
	liveness.FailureThreshold *= 2
	return readiness, liveness
}

// workloadOf is what d runs: d.workload, or, from a ctrl of the previous
// release that sends none, the same values in d's top-level fields (read
// for one more release; they never grow).
func workloadOf(d *clusterv1.Deployment) *clusterv1.Workload {
	if w := d.GetWorkload(); w != nil {
		return w
	}
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	return &clusterv1.Workload{Image: d.GetImage(), Command: d.GetCommand(), EnvVars: d.GetEnvVars(), CpuMillicores: d.GetCpuMillicores(),
		//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
		MemoryMib: d.GetMemoryMib(), Port: d.GetPort(), Healthcheck: d.GetHealthcheck(), ShutdownSignal: d.GetShutdownSignal()}
}

// specHash identifies the desired spec (deterministic proto encoding). It
// hashes the previous release's form (the workload's fields of that
// release at d's top level, only newer ones in d.workload), so objects
// applied before ctrl sent workloads keep their hash and are not written
// again for it.
func specHash(d *clusterv1.Deployment) string {
	w := workloadOf(d)
	n := proto.CloneOf(d)
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	n.Image, n.Command, n.EnvVars, n.CpuMillicores = w.GetImage(), w.GetCommand(), w.GetEnvVars(), w.GetCpuMillicores()
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	n.MemoryMib, n.Port, n.Healthcheck, n.ShutdownSignal = w.GetMemoryMib(), w.GetPort(), w.GetHealthcheck(), w.GetShutdownSignal()
	n.Workload = proto.CloneOf(w)
	n.Workload.Image, n.Workload.Command, n.Workload.EnvVars, n.Workload.CpuMillicores = "", nil, nil, 0
	n.Workload.MemoryMib, n.Workload.Port, n.Workload.Healthcheck, n.Workload.ShutdownSignal = 0, 0, nil, ""
	if proto.Size(n.Workload) == 0 {
		n.Workload = nil
	}
	data, _ := proto.MarshalOptions{Deterministic: true}.Marshal(n)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12])
}

func withLabel(l map[string]string, k, v string) map[string]string {
	out := maps.Clone(l)
	out[k] = v
	return out
}

func ptr[T any](v T) *T { return &v }
