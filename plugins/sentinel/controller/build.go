package controller

import (
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk/kube"
)

// Labels of the seeds, carried by every object and the pods.
const (
	LabelWorkspace   = "unkey.com/workspace.id"
	LabelProject     = "unkey.com/project.id"
	LabelApp         = "unkey.com/app.id"
	LabelEnvironment = "unkey.com/environment.id"
	LabelSentinel    = "unkey.com/sentinel.id"
	// Component is the app.kubernetes.io/component value of every object.
	Component = "sentinel"
)

// Scheduling facts of the sentinel node pool.
const (
	NodeClassLabel    = "node-class"
	NodeClassSentinel = "sentinel"
	ZoneLabel         = "topology.kubernetes.io/zone"
)

// Fixed shape of the workload.
const (
	ContainerName   = "sentinel"
	MinReadySeconds = 5
	gossipSuffix    = "-gossip"
	portNameHTTP    = "http"
	portNameTCP     = "gossip-tcp"
	portNameUDP     = "gossip-udp"
	portNameAdmin   = "admin"
)

// PolicyGVR is the CiliumNetworkPolicy resource, applied with the dynamic
// client so this plugin does not link cilium's module.
var PolicyGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

// params are the cluster-wide inputs of the builders (plugin config and the
// host's region).
type params struct {
	settings
	Region string
}

// identity is what names and labels a sentinel's objects. It can be rebuilt
// from a live Deployment, which lets the gossip policy be applied when the
// CRD appears without waiting for the next desired state.
type identity struct {
	ID, K8sName                                  string
	WorkspaceID, ProjectID, AppID, EnvironmentID string
	Version                                      uint64
	SpecHash                                     string
}

func identityOf(s *clusterv1.Sentinel, version uint64) identity {
	return identity{
		ID: s.GetId(), K8sName: s.GetK8SName(),
		WorkspaceID: s.GetWorkspaceId(), ProjectID: s.GetProjectId(), AppID: s.GetAppId(), EnvironmentID: s.GetEnvironmentId(),
		Version: version, SpecHash: specHash(s),
	}
}

func identityFromDeployment(d *appsv1.Deployment) identity {
	l := d.Labels
	return identity{
		ID: l[LabelSentinel], K8sName: d.Name,
		WorkspaceID: l[LabelWorkspace], ProjectID: l[LabelProject], AppID: l[LabelApp], EnvironmentID: l[LabelEnvironment],
		Version: kube.AppliedVersion(d.Annotations), SpecHash: d.Annotations[kube.SpecHashAnnotation],
	}
}

// specHash hashes the desired state itself (not the plugin config), so the
// annotation tells whether ctrl's spec changed. Sealed credentials enter it
// by their hash, and only when present: the hash of a sentinel without
// credentials is what it always was.
func specHash(s *clusterv1.Sentinel) string {
	h := kube.SpecHash(struct {
		ID, K8sName, Workspace, Project, App, Environment, Image string
		Replicas                                                 int32
		CPU, Memory                                              int64
	}{s.GetId(), s.GetK8SName(), s.GetWorkspaceId(), s.GetProjectId(), s.GetAppId(), s.GetEnvironmentId(), s.GetImage(), s.GetReplicas(), s.GetCpuMillicores(), s.GetMemoryMib()})
	if c := credentialsHash(s); c != "" {
		h = kube.SpecHash(struct{ Spec, Credentials string }{h, c})
	}
	return h
}

func (id identity) labels() map[string]string {
	l := kube.ManagedLabels(Component)
	l[LabelWorkspace] = id.WorkspaceID
	l[LabelProject] = id.ProjectID
	l[LabelApp] = id.AppID
	l[LabelEnvironment] = id.EnvironmentID
	l[LabelSentinel] = id.ID
	return l
}

// meta is the metadata of every object: labels, and the applied version and
// spec hash. The pod template gets the labels only, so a new version with
// the same spec does not roll the pods.
func (id identity) meta(name, namespace string, owner *metav1.OwnerReference) metav1.ObjectMeta {
	m := metav1.ObjectMeta{
		Name: name, Namespace: namespace, Labels: id.labels(),
		Annotations: kube.VersionAnnotations(id.Version, id.SpecHash),
	}
	if owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return m
}

// podSelector selects this sentinel's pods. It is the Deployment's
// (immutable) selector, so it must only use what never changes.
func (id identity) podSelector() map[string]string {
	return map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: Component, LabelSentinel: id.ID}
}

// environmentSelector selects the pods of every sentinel of the environment
// in the namespace: the gossip peers.
func (id identity) environmentSelector() map[string]string {
	return map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: Component, LabelEnvironment: id.EnvironmentID}
}

func gossipName(k8sName string) string { return k8sName + gossipSuffix }

// ownerRef makes the Deployment own an object, so deleting the Deployment
// (by Krane, or by hand) garbage-collects the rest.
func ownerRef(d *appsv1.Deployment) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr(true)}
}

// ownerRefFromUID is ownerRef when only the Deployment's name and UID are known.
func ownerRefFromUID(name string, uid types.UID) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name, UID: uid, Controller: ptr(true)}
}

func buildNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: kube.ManagedLabels(Component)},
	}
}

// buildServiceAccount is the account sentinel pods run as. Krane creates
// it so that pods can start; what it may read is granted by the manifests
// (pods.yaml), never by the plugin, which could not grant more than it
// holds anyway.
func buildServiceAccount(p params) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: p.ServiceAccount, Namespace: p.Namespace, Labels: kube.ManagedLabels(Component)},
	}
}

func buildDeployment(s *clusterv1.Sentinel, version uint64, p params) *appsv1.Deployment {
	id := identityOf(s, version)
	cpu := *resource.NewMilliQuantity(s.GetCpuMillicores(), resource.DecimalSI)
	mem := *resource.NewQuantity(s.GetMemoryMib()*1024*1024, resource.BinarySI)
	// requests = limits: the proxy layer gets the Guaranteed QoS class and
	// is the last to be evicted under node pressure.
	res := corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem}

	pod := corev1.PodSpec{
		// A sentinel reads two things from the Kubernetes API, as its own
		// account (which the manifests bind read-only): its routes
		// ConfigMap, and the EndpointSlices of the deployment it routes
		// to. A namespace full of Services must not flood its environment.
		ServiceAccountName:           p.ServiceAccount,
		AutomountServiceAccountToken: ptr(true),
		EnableServiceLinks:           ptr(false),
		Tolerations: []corev1.Toleration{{
			Key: NodeClassLabel, Operator: corev1.TolerationOpEqual, Value: NodeClassSentinel, Effect: corev1.TaintEffectNoSchedule,
		}},
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: ZoneLabel, WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector: &metav1.LabelSelector{MatchLabels: id.podSelector()},
			// Spread each revision on its own, so a rolling update does not
			// pile the new pods into the zone the old ones are leaving.
			MatchLabelKeys: []string{appsv1.DefaultDeploymentUniqueLabelKey},
		}},
		Containers: []corev1.Container{{
			Name:            ContainerName,
			Image:           s.GetImage(),
			ImagePullPolicy: corev1.PullIfNotPresent,
			Ports: []corev1.ContainerPort{
				{Name: portNameHTTP, ContainerPort: p.Port, Protocol: corev1.ProtocolTCP},
				{Name: portNameTCP, ContainerPort: p.GossipPort, Protocol: corev1.ProtocolTCP},
				{Name: portNameUDP, ContainerPort: p.GossipPort, Protocol: corev1.ProtocolUDP},
				{Name: portNameAdmin, ContainerPort: p.AdminPort, Protocol: corev1.ProtocolTCP},
			},
			// The restricted Pod Security Standard (the manifests enforce
			// it on the namespace): a proxy facing the internet runs
			// unprivileged, as a non-root user, with no capabilities.
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr(false),
				RunAsNonRoot:             ptr(true),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Env:       containerEnv(id, p),
			EnvFrom:   envFrom(p.EnvFromSecrets, s),
			Resources: corev1.ResourceRequirements{Requests: res, Limits: res},
			LivenessProbe: &corev1.Probe{
				ProbeHandler:  httpGet(p.LivenessPath, p.Port),
				PeriodSeconds: 10, TimeoutSeconds: 2, FailureThreshold: 3,
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  httpGet(p.ReadinessPath, p.Port),
				PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3,
			},
		}},
	}
	if p.RequireSentinelNodes {
		pod.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: NodeClassLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{NodeClassSentinel}}},
			}}},
		}}
	}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: id.meta(s.GetK8SName(), p.Namespace, nil),
		Spec: appsv1.DeploymentSpec{
			Replicas:        ptr(s.GetReplicas()),
			MinReadySeconds: MinReadySeconds,
			Selector:        &metav1.LabelSelector{MatchLabels: id.podSelector()},
			// Surge one pod at a time and never go below the desired count:
			// a sentinel keeps serving at full capacity during a rollout.
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr(intstr.FromInt32(0)),
					MaxSurge:       ptr(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: id.labels(), Annotations: templateAnnotations(s)},
				Spec:       pod,
			},
		},
	}
}

// containerEnv tells the sentinel who it is and where its peers are.
func containerEnv(id identity, p params) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "UNKEY_SENTINEL_ID", Value: id.ID},
		{Name: "UNKEY_WORKSPACE_ID", Value: id.WorkspaceID},
		{Name: "UNKEY_PROJECT_ID", Value: id.ProjectID},
		{Name: "UNKEY_APP_ID", Value: id.AppID},
		{Name: "UNKEY_ENVIRONMENT_ID", Value: id.EnvironmentID},
		{Name: "UNKEY_REGION", Value: p.Region},
		{Name: "UNKEY_HTTP_PORT", Value: strconv.Itoa(int(p.Port))},
		{Name: "UNKEY_GOSSIP_PORT", Value: strconv.Itoa(int(p.GossipPort))},
		{Name: "UNKEY_GOSSIP_SERVICE", Value: fmt.Sprintf("%s.%s.svc", gossipName(id.K8sName), p.Namespace)},
		{Name: "UNKEY_INSTANCE_ID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		// Where the routes are, and where metrics and health are served
		// (the admin port is never the data port: it is not for the
		// internet).
		{Name: "KRANE_SENTINEL_ROUTES", Value: p.Namespace + "/" + routesName(id.K8sName)},
		{Name: "KRANE_SENTINEL_ADMIN_ADDR", Value: ":" + strconv.Itoa(int(p.AdminPort))},
	}
}

// envFrom reads the config's env_from_secrets, then the sentinel's
// credentials Secret: last, so its keys win over theirs.
func envFrom(secrets []SecretRef, s *clusterv1.Sentinel) []corev1.EnvFromSource {
	var out []corev1.EnvFromSource
	for _, s := range secrets {
		ref := &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: s.Name}}
		if s.Optional {
			ref.Optional = ptr(true)
		}
		out = append(out, corev1.EnvFromSource{SecretRef: ref})
	}
	if len(s.GetEncryptedCredentials()) > 0 {
		out = append(out, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: credentialsName(s.GetK8SName())}}})
	}
	return out
}

// templateAnnotations carry the hash of the sealed credentials, so that
// new credentials roll the pods (their environment is read at start).
func templateAnnotations(s *clusterv1.Sentinel) map[string]string {
	if h := credentialsHash(s); h != "" {
		return map[string]string{CredentialsHashAnnotation: h}
	}
	return nil
}

func httpGet(path string, port int32) corev1.ProbeHandler {
	return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}}
}

// buildService is the sentinel's stable ClusterIP address.
func buildService(s *clusterv1.Sentinel, version uint64, p params, owner *metav1.OwnerReference) *corev1.Service {
	id := identityOf(s, version)
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: id.meta(s.GetK8SName(), p.Namespace, owner),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: id.podSelector(),
			Ports: []corev1.ServicePort{{
				Name: portNameHTTP, Protocol: corev1.ProtocolTCP, Port: p.Port, TargetPort: intstr.FromString(portNameHTTP),
			}},
		},
	}
}

// buildPDB keeps at least one pod available through voluntary disruptions
// (node drains, consolidation). With one replica that means minAvailable 1:
// a drain waits until someone scales the sentinel up, the price of running
// a single replica. With more, maxUnavailable 1: evictions proceed one pod
// at a time and replicas-1 >= 1 pods keep serving, where minAvailable 1
// would let a drain take all but one pod at once. Unhealthy pods may always
// be evicted, so a crash-looping pod never blocks a drain.
func buildPDB(s *clusterv1.Sentinel, version uint64, p params, owner *metav1.OwnerReference) *policyv1.PodDisruptionBudget {
	id := identityOf(s, version)
	spec := policyv1.PodDisruptionBudgetSpec{
		Selector:                   &metav1.LabelSelector{MatchLabels: id.podSelector()},
		UnhealthyPodEvictionPolicy: ptr(policyv1.AlwaysAllow),
	}
	if s.GetReplicas() <= 1 {
		spec.MinAvailable = ptr(intstr.FromInt32(1))
	} else {
		spec.MaxUnavailable = ptr(intstr.FromInt32(1))
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: id.meta(s.GetK8SName(), p.Namespace, owner),
		Spec:       spec,
	}
}

// buildGossipService is the headless Service through which a sentinel finds
// its peers: every sentinel pod of the environment, ready or not (a peer
// must be discoverable before it passes its readiness probe).
func buildGossipService(id identity, p params, owner *metav1.OwnerReference) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: id.meta(gossipName(id.K8sName), p.Namespace, owner),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 id.environmentSelector(),
			Ports: []corev1.ServicePort{
				{Name: portNameTCP, Protocol: corev1.ProtocolTCP, Port: p.GossipPort, TargetPort: intstr.FromInt32(p.GossipPort)},
				{Name: portNameUDP, Protocol: corev1.ProtocolUDP, Port: p.GossipPort, TargetPort: intstr.FromInt32(p.GossipPort)},
			},
		},
	}
}

// buildGossipPolicy allows gossip (TCP and UDP) between the sentinel pods of
// the environment. From/to selectors of a namespaced policy are confined to
// its namespace by Cilium. enableDefaultDeny is off in both directions: the
// policy only adds an allowance and must not put sentinels into
// default-deny, which would cut their traffic to clients and databases.
func buildGossipPolicy(id identity, p params, owner *metav1.OwnerReference) (*unstructured.Unstructured, error) {
	meta := &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: PolicyGVR.GroupVersion().String(), Kind: "CiliumNetworkPolicy"},
		ObjectMeta: id.meta(gossipName(id.K8sName), p.Namespace, owner),
	}
	u, err := kube.ToUnstructured(meta)
	if err != nil {
		return nil, err
	}
	peers := func() []any { return []any{map[string]any{"matchLabels": stringMap(id.environmentSelector())}} }
	ports := func() []any {
		port := strconv.Itoa(int(p.GossipPort))
		return []any{map[string]any{"ports": []any{
			map[string]any{"port": port, "protocol": "TCP"},
			map[string]any{"port": port, "protocol": "UDP"},
		}}}
	}
	u.Object["spec"] = map[string]any{
		"description":       fmt.Sprintf("gossip between the sentinels of environment %s", id.EnvironmentID),
		"endpointSelector":  map[string]any{"matchLabels": stringMap(id.environmentSelector())},
		"enableDefaultDeny": map[string]any{"ingress": false, "egress": false},
		"ingress":           []any{map[string]any{"fromEndpoints": peers(), "toPorts": ports()}},
		"egress":            []any{map[string]any{"toEndpoints": peers(), "toPorts": ports()}},
	}
	return u, nil
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ptr[T any](v T) *T { return &v }
