package check

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/serve"
	"krane.dev/host/config"
)

// setEnv replaces every variable with prefix in the test's environment by
// env's (restored when the test ends): the programs' loaders read the
// process environment.
func setEnv(t *testing.T, prefix string, env map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, prefix) {
			os.Unsetenv(k)
			t.Cleanup(func() { os.Setenv(k, v) })
		}
	}
	for k, v := range env {
		if strings.HasPrefix(k, prefix) {
			t.Setenv(k, v)
		}
	}
}

func portNamed(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// expectPort checks that the address a program listens on is the
// container port of that name.
func expectPort(t *testing.T, w Workload, c corev1.Container, name, key, addr string) {
	t.Helper()
	got, err := ListenPort(addr)
	if err != nil {
		t.Errorf("%s: %s: %v", w, key, err)
		return
	}
	want, ok := portNamed(c, name)
	if !ok || want != got {
		t.Errorf("%s: %s listens on %d, but container port %q is %d", w, key, got, name, want)
	}
}

type ctrlInstall struct {
	w   Workload
	cfg serve.Config
}

// ctrlUsesKubernetes reports whether ctrl's binary links a Kubernetes
// client at all; it does not, which is why its ServiceAccount needs no
// role.
var ctrlUsesKubernetes = sync.OnceValues(func() ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/ctrl")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps ./cmd/ctrl: %w", err)
	}
	var clients []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/client-go/") {
			clients = append(clients, p)
		}
	}
	return clients, nil
})

// checkCtrl loads ctrl's configuration the way `ctrl serve` does in the
// pod (the ConfigMap file, the container's environment) and follows its
// addresses: its listeners are the container's ports, its Restate URLs
// reach the Restate of the overlay, and Restate reaches its endpoint.
func checkCtrl(t *testing.T, in *install) *ctrlInstall {
	w, ok := in.o.WorkloadWith("ctrl")
	if !ok {
		return nil
	}
	c, _ := w.Container("ctrl")
	if !slices.Contains(c.Args, "serve") {
		t.Errorf("%s: the ctrl container does not run `ctrl serve` (args %v)", w, c.Args)
	}
	env, err := in.o.PodEnv(w, c, podFields(w))
	if err != nil {
		t.Error(err)
		return nil
	}
	local, err := in.o.Files(w, c, in.workDir(t, c.Name))
	if err != nil {
		t.Error(err)
		return nil
	}
	if p := env["CTRL_CONFIG"]; p != "" {
		lp, ok := local(p)
		if !ok {
			t.Errorf("%s: CTRL_CONFIG names %s, which no ConfigMap volume provides", w, p)
			return nil
		}
		env["CTRL_CONFIG"] = lp
	}
	// The key Restate signs its calls with is the operator's to make
	// (docs/operating.md): it must come from a Secret, and any valid key
	// stands in for it here.
	if k := env["CTRL_RESTATE_IDENTITY_KEYS"]; k != "" {
		if !strings.HasPrefix(k, "secret:") {
			t.Errorf("%s: restate.identity_keys must come from a Secret (CTRL_RESTATE_IDENTITY_KEYS from secretKeyRef), not from the configuration", w)
		}
		_, public, err := restateendpoint.NewIdentityKeyPEM()
		if err != nil {
			t.Fatal(err)
		}
		env["CTRL_RESTATE_IDENTITY_KEYS"] = public
	}
	setEnv(t, "CTRL_", env)
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Errorf("%s: ctrl refuses its configuration: %v", w, err)
		return nil
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: ctrl refuses its configuration: %v", w, err)
		return nil
	}
	if !strings.HasPrefix(cfg.DB.DSN, "secret:") {
		t.Errorf("%s: db.dsn must come from a Secret (CTRL_DB_DSN from secretKeyRef), not from the configuration", w)
	}
	expectPort(t, w, c, "grpc", "grpc.addr", cfg.GRPC.Addr)
	expectPort(t, w, c, "http", "http.addr", cfg.HTTP.Addr)
	if cfg.Console.Enabled() {
		expectPort(t, w, c, "console", "console.addr", cfg.Console.Addr)
	}
	for key, p := range map[string]string{"vault.keyring_file": cfg.Vault.KeyringFile, "grpc.tls_cert": cfg.GRPC.TLSCert, "grpc.tls_key": cfg.GRPC.TLSKey, "grpc.client_ca": cfg.GRPC.ClientCA} {
		if p != "" {
			if _, ok := MountedAt(w, c, p); !ok {
				t.Errorf("%s: %s is %s, which no volume of the container provides", w, key, p)
			}
		}
	}
	if clients, err := ctrlUsesKubernetes(); err != nil {
		t.Error(err)
	} else if len(clients) > 0 {
		t.Errorf("ctrl now links a Kubernetes client (%s): give its ServiceAccount the roles it needs and teach this check what it uses", strings.Join(clients, ", "))
	}
	if !cfg.Restate.Enabled() {
		return &ctrlInstall{w: w, cfg: cfg}
	}
	expectPort(t, w, c, "restate", "restate.endpoint.listen", cfg.Restate.Endpoint.Listen)
	if w.Replicas > 1 && cfg.Restate.Endpoint.URL == "" {
		t.Errorf("%s: %d replicas need restate.endpoint.url naming one Service for all of them", w, w.Replicas)
	}
	restate, hasRestate := in.o.WorkloadWith("restate")
	for _, u := range []struct{ key, url, port string }{
		{"restate.ingress_url", cfg.Restate.IngressURL, "ingress"},
		{"restate.admin_url", cfg.Restate.AdminURL, "admin"},
	} {
		ep, inCluster, err := in.o.ResolveURL(u.url, w.Namespace)
		switch {
		case err != nil:
			t.Errorf("%s: %s: %v", w, u.key, err)
		case !inCluster:
			t.Logf("%s: %s %s is outside the cluster", w, u.key, u.url)
		case !hasRestate || ep.Workload.String() != restate.String():
			t.Errorf("%s: %s %s leads to %s, not to the overlay's Restate", w, u.key, u.url, ep.Workload)
		case ep.Port.Name != u.port:
			t.Errorf("%s: %s %s reaches Restate's port %q, want %q", w, u.key, u.url, ep.Port.Name, u.port)
		default:
			in.conns = append(in.conns, connection{what: "ctrl calls Restate (" + u.key + ")", from: w, to: ep, private: true})
		}
	}
	if hasRestate && cfg.Restate.Endpoint.URL != "" {
		ep, inCluster, err := in.o.ResolveURL(cfg.Restate.Endpoint.URL, restate.Namespace)
		listen, _ := ListenPort(cfg.Restate.Endpoint.Listen)
		switch {
		case err != nil:
			t.Errorf("%s: restate.endpoint.url: %v", w, err)
		case !inCluster || ep.Workload.String() != w.String() || ep.Port.ContainerPort != listen:
			t.Errorf("%s: restate.endpoint.url %s does not lead Restate to ctrl's endpoint port %d", w, cfg.Restate.Endpoint.URL, listen)
		default:
			in.conns = append(in.conns, connection{what: "Restate calls ctrl's endpoint (restate.endpoint.url)", from: restate, to: ep, private: true})
		}
	}
	return &ctrlInstall{w: w, cfg: cfg}
}

type kraneInstall struct {
	w       Workload
	env     map[string]string
	hclPath string // the rendered krane.hcl, written locally
	cfg     *config.Config
}

// checkKrane loads krane.hcl the way `krane run` does in the pod and
// checks what the pod must agree with: its listener, leader election for
// several replicas, the plugins in the image, a token from a Secret, and
// the way to ctrl.
func checkKrane(t *testing.T, in *install) *kraneInstall {
	w, ok := in.o.WorkloadWith("krane")
	if !ok {
		return nil
	}
	c, _ := w.Container("krane")
	env, err := in.o.PodEnv(w, c, podFields(w))
	if err != nil {
		t.Error(err)
		return nil
	}
	local, err := in.o.Files(w, c, in.workDir(t, c.Name))
	if err != nil {
		t.Error(err)
		return nil
	}
	i := slices.Index(c.Args, "-c")
	if i < 0 || i+1 >= len(c.Args) {
		t.Errorf("%s: the krane container's args %v name no config file (-c)", w, c.Args)
		return nil
	}
	hcl, ok := local(c.Args[i+1])
	if !ok {
		t.Errorf("%s: krane reads %s, which no ConfigMap volume provides", w, c.Args[i+1])
		return nil
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	cfg, err := config.Load(hcl, environ)
	if err != nil {
		t.Errorf("%s: krane refuses its configuration: %v", w, err)
		return nil
	}
	expectPort(t, w, c, "http", "server.listen", cfg.Server.Listen)
	if w.Replicas > 1 && !cfg.Leader.Enabled {
		t.Errorf("%s: %d replicas without leader_election would all run the controllers", w, w.Replicas)
	}
	if cfg.Leader.Enabled && cfg.Leader.Namespace != w.Namespace {
		t.Errorf("%s: leader_election.namespace is %q, not krane's namespace", w, cfg.Leader.Namespace)
	}
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), strings.TrimSuffix(cfg.PluginDir, "/")+"/") {
		t.Errorf("%s: plugin_dir %s is not where the Dockerfile puts the plugins", w, cfg.PluginDir)
	}
	for _, ctl := range cfg.Enabled() {
		if _, err := os.Stat(filepath.Join(repoRoot, "plugins", ctl.Name, "rbac.yaml")); err != nil {
			t.Errorf("%s: controller %q is enabled but plugins/%s/rbac.yaml (its role) does not exist", w, ctl.Name, ctl.Name)
		}
	}
	if te := cfg.ControlPlane.TokenEnv; te == "" || !strings.HasPrefix(env[te], "secret:") {
		t.Errorf("%s: the cluster token must come from a Secret through control_plane.token_env", w)
	}
	ep, inCluster, err := in.o.ResolveURL(cfg.ControlPlane.URL, w.Namespace)
	switch {
	case err != nil:
		t.Errorf("%s: control_plane.url: %v", w, err)
	case !inCluster && strings.HasPrefix(cfg.ControlPlane.URL, "http://"):
		t.Errorf("%s: control_plane.url %s leaves the cluster without TLS", w, cfg.ControlPlane.URL)
	case !inCluster:
	case !slices.ContainsFunc(ep.Workload.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "ctrl" }) || ep.Port.Name != "grpc":
		t.Errorf("%s: control_plane.url %s does not lead to ctrl's gRPC port", w, cfg.ControlPlane.URL)
	default:
		in.conns = append(in.conns, connection{what: "krane calls ctrl (control_plane.url)", from: w, to: ep})
	}
	return &kraneInstall{w: w, env: env, hclPath: hcl, cfg: cfg}
}

// checkNetwork evaluates the overlay's NetworkPolicies for every
// connection the configuration makes: each must be allowed; a private one
// (Restate's ingress, admin API and node port, ctrl's Restate endpoint)
// must be refused to every other workload, to a stranger pod in the
// namespace and to a pod in another namespace that copies the caller's
// labels.
func checkNetwork(t *testing.T, in *install) {
	o := in.o
	if in.restate != nil {
		for _, port := range []string{"ingress", "admin", "node"} {
			found := false
			for _, cn := range in.conns {
				found = found || (cn.private && cn.to.Workload.String() == in.restate.w.String() && cn.to.Port.Name == port)
			}
			if !found {
				t.Errorf("%s: nothing in the overlay is configured to call Restate's %s port, so nothing shows who may", in.restate.w, port)
			}
		}
	}
	callers := map[string][]string{}
	key := func(ep Endpoint) string { return fmt.Sprintf("%s:%d", ep.Workload, ep.Port.ContainerPort) }
	for _, cn := range in.conns {
		callers[key(cn.to)] = append(callers[key(cn.to)], cn.from.String())
	}
	for _, cn := range in.conns {
		to := o.Pod(cn.to.Workload)
		port := intstr.FromInt32(cn.to.Port.ContainerPort)
		if !IngressAllowed(o.NetworkPolicies, o.Pod(cn.from), to, port) {
			t.Errorf("%s: the NetworkPolicies refuse %s to reach port %s of %s", cn.what, cn.from, cn.to.Port.Name, cn.to.Workload)
		}
		if !cn.private {
			continue
		}
		from := o.Pod(cn.from)
		others := map[string]Pod{
			"a stranger pod in namespace " + to.Namespace:         {Namespace: to.Namespace, NamespaceLabels: o.Namespaces[to.Namespace], Labels: map[string]string{"app.kubernetes.io/name": "stranger"}},
			"a pod with the caller's labels in namespace default": {Namespace: "default", NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "default"}, Labels: from.Labels},
		}
		for _, w := range o.Workloads {
			if !slices.Contains(callers[key(cn.to)], w.String()) {
				others[w.String()] = o.Pod(w)
			}
		}
		for what, p := range others {
			if IngressAllowed(o.NetworkPolicies, p, to, port) {
				t.Errorf("%s: the NetworkPolicies also let %s reach port %s of %s", cn.what, what, cn.to.Port.Name, cn.to.Workload)
			}
		}
	}
}
