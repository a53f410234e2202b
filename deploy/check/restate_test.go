package check

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	corev1 "k8s.io/api/core/v1"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/internal/testenv"
)

type restateInstall struct {
	w           Workload
	replication int64
}

// checkRestate has restate-server itself read the overlay's restate.toml
// with the pod's environment (--dump-config) and checks the result: every
// key of the file took effect (none misspelt or misplaced), the node
// listens on the container's ports, its name and advertised address are
// the StatefulSet's stable ones, the metadata addresses are exactly the
// StatefulSet's nodes, and a cluster of several nodes is replicated and
// never provisions itself.
func checkRestate(t *testing.T, in *install) *restateInstall {
	w, ok := in.o.WorkloadWith("restate")
	if !ok {
		return nil
	}
	if w.Kind != "StatefulSet" {
		t.Errorf("%s: Restate nodes need stable names and volumes: run them in a StatefulSet", w)
		return nil
	}
	c, _ := w.Container("restate")
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
	file, ok := local(env["RESTATE_CONFIG"])
	if !ok {
		t.Errorf("%s: RESTATE_CONFIG names %q, which no ConfigMap volume provides", w, env["RESTATE_CONFIG"])
		return nil
	}
	env["RESTATE_CONFIG"] = file
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var written map[string]any
	if err := toml.Unmarshal(data, &written); err != nil {
		t.Errorf("%s: restate.toml: %v", w, err)
		return nil
	}
	dumped, err := restateDump(t, env)
	if err != nil {
		t.Errorf("%s: %v", w, err)
		return nil
	}
	for _, key := range leaves(written, "") {
		want, _ := lookup(written, key)
		got, ok := lookup(dumped, key)
		if !ok || !sameValue(want, got) {
			t.Errorf("%s: restate.toml sets %s = %v, but Restate reads %v (a misspelt or misplaced key?)", w, key, want, got)
		}
	}
	str := func(key string) string { v, _ := lookup(dumped, key); s, _ := v.(string); return s }
	for key, port := range map[string]string{"bind-address": "node", "admin.bind-address": "admin", "ingress.bind-address": "ingress"} {
		expectPort(t, w, c, port, key, str(key))
	}
	nodePort, _ := portNamed(c, "node")
	node := func(i int32) string { return fmt.Sprintf("http://%s-%d.%s:%d", w.Name, i, w.ServiceName, nodePort) }
	if got := str("node-name"); got != w.Name+"-0" {
		t.Errorf("%s: the first node is called %q, want its pod name %s-0 (RESTATE_NODE_NAME from metadata.name)", w, got, w.Name)
	}
	if got := strings.TrimSuffix(str("advertised-address"), "/"); got != node(0) {
		t.Errorf("%s: the first node advertises %q, want its stable name %s", w, got, node(0))
	}
	svc, ok := in.o.Service(w.Namespace, w.ServiceName)
	if !ok || svc.Spec.ClusterIP != "None" || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("%s: serviceName %s must be a headless Service publishing not-ready pods (nodes find each other before they are ready)", w, w.ServiceName)
	}
	var want []string
	for i := range w.Replicas {
		want = append(want, node(i))
	}
	addrs, _ := lookup(dumped, "metadata-client.addresses")
	var got []string
	if list, ok := addrs.([]any); ok {
		for _, a := range list {
			got = append(got, strings.TrimSuffix(fmt.Sprint(a), "/"))
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("%s: metadata-client.addresses are %v, want every node of the StatefulSet's %d: %v", w, got, w.Replicas, want)
	} else {
		for _, p := range c.Ports {
			if p.Name == "node" {
				in.conns = append(in.conns, connection{what: "Restate nodes call each other (metadata-client.addresses)", from: w, to: Endpoint{Service: svc, Workload: w, Port: p}, private: true})
			}
		}
	}
	replication, _ := lookup(dumped, "default-replication")
	r, _ := replication.(int64)
	auto, _ := lookup(dumped, "auto-provision")
	switch {
	case r < 1 || r > int64(w.Replicas):
		t.Errorf("%s: default-replication %v does not fit %d nodes", w, replication, w.Replicas)
	case w.Replicas > 1 && r < 2:
		t.Errorf("%s: %d nodes with default-replication %d: one failure loses data", w, w.Replicas, r)
	case w.Replicas > 1 && 2*r-1 > int64(w.Replicas):
		t.Errorf("%s: default-replication %d needs %d nodes to survive a failure, there are %d", w, r, 2*r-1, w.Replicas)
	}
	if w.Replicas > 1 && auto != false {
		t.Errorf("%s: auto-provision must be false with %d nodes (several nodes provisioning make several clusters)", w, w.Replicas)
	}
	if v, ok := MountedAt(w, c, str("base-dir")); !ok || !slices.ContainsFunc(w.Claims, func(p corev1.PersistentVolumeClaim) bool { return p.Name == v.Name }) {
		t.Errorf("%s: base-dir %s is not on the StatefulSet's persistent volume", w, str("base-dir"))
	}
	if p := str("worker.invoker.request-identity-private-key-pem-file"); p == "" {
		t.Errorf("%s: Restate does not sign its requests (worker.invoker.request-identity-private-key-pem-file): ctrl could not tell Restate's calls from anyone's", w)
	} else if v, ok := MountedAt(w, c, p); !ok || v.Secret == nil {
		t.Errorf("%s: the request identity key %s is not on a Secret volume", w, p)
	}
	return &restateInstall{w: w, replication: r}
}

// restateDump runs restate-server --dump-config with env (the pod's
// RESTATE_* variables) and returns the configuration it would run with.
func restateDump(t *testing.T, env map[string]string) (map[string]any, error) {
	bin := testenv.RestateServerBin()
	if _, err := os.Stat(bin); err != nil {
		return nil, &testenv.MissingBinaryError{Binary: "restate-server", Looked: bin, Fix: "run `make testenv` to install it from the npm registry"}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--dump-config")
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RESTATE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		if strings.HasPrefix(k, "RESTATE_") {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("restate-server --dump-config refuses the configuration: %v\n%s", err, stderr.String())
	}
	if strings.Contains(strings.ToLower(stderr.String()), "deprecated") {
		return nil, fmt.Errorf("restate-server warns about the configuration: %s", strings.TrimSpace(stderr.String()))
	}
	var dumped map[string]any
	if err := toml.Unmarshal(out, &dumped); err != nil {
		return nil, fmt.Errorf("restate-server --dump-config printed something that is not TOML: %w", err)
	}
	return dumped, nil
}

// leaves lists the dotted paths of m's values that are not tables.
func leaves(m map[string]any, prefix string) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, leaves(sub, prefix+k+".")...)
		} else {
			out = append(out, prefix+k)
		}
	}
	sort.Strings(out)
	return out
}

func lookup(m map[string]any, path string) (any, bool) {
	var cur any = m
	for _, k := range strings.Split(path, ".") {
		t, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = t[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// sameValue compares a written value with Restate's, which may spell an
// address with a trailing slash and a size with a decimal ("1 GiB" reads
// back as "1.0 GiB").
func sameValue(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	if al, ok := a.([]any); ok {
		bl, ok := b.([]any)
		if !ok || len(al) != len(bl) {
			return false
		}
		for i := range al {
			if !sameValue(al[i], bl[i]) {
				return false
			}
		}
		return true
	}
	as, aok := a.(string)
	bs, bok := b.(string)
	if !aok || !bok {
		return false
	}
	if strings.TrimSuffix(as, "/") == strings.TrimSuffix(bs, "/") {
		return true
	}
	an, aunit, aok := strings.Cut(as, " ")
	bn, bunit, bok := strings.Cut(bs, " ")
	af, aerr := strconv.ParseFloat(an, 64)
	bf, berr := strconv.ParseFloat(bn, 64)
	return aok && bok && aerr == nil && berr == nil && af == bf && aunit == bunit
}

// restatectlBin is restatectl, installed next to restate-server by `make
// testenv`.
func restatectlBin() string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(testenv.RestateServerBin()))), "restatectl-linux-x64", "bin", "restatectl")
}

// provisionCommand is the restatectl command docs/operating.md tells
// operators to provision the cluster with (its arguments after
// "restatectl").
func provisionCommand(t *testing.T) []string {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(doc)) {
		if _, after, ok := strings.Cut(line, "restatectl provision"); ok {
			return append([]string{"provision"}, strings.Fields(after)...)
		}
	}
	t.Fatal("docs/operating.md shows no `restatectl provision` command")
	return nil
}

// checkRestateCluster runs the overlay's Restate nodes as local processes,
// from the rendered restate.toml and the pods' environment with only the
// addresses (and the memory budget) made local, and checks that they form
// one cluster: a multi-node cluster provisioned with the command
// docs/operating.md shows (its nodes passing their liveness probe while
// they wait for it), a single node on its own. Every node must then pass
// its readiness and liveness probes.
func checkRestateCluster(t *testing.T, in *install) {
	w := in.restate.w
	c, _ := w.Container("restate")
	key, err := identityKey(in.workDir(t, "identity"))
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		p                                *testenv.Process
		nodePort, adminPort, ingressPort int
	}
	nodes := make([]node, w.Replicas)
	var addresses []string
	for i := range nodes {
		ports, err := testenv.FreePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = node{nodePort: ports[0], adminPort: ports[1], ingressPort: ports[2]}
		addresses = append(addresses, fmt.Sprintf("%q", fmt.Sprintf("http://127.0.0.1:%d", ports[0])))
	}
	dir := in.workDir(t, "restate-cluster")
	for i := range nodes {
		n := &nodes[i]
		fields := podFields(w)
		fields["metadata.name"] = fmt.Sprintf("%s-%d", w.Name, i)
		env, err := in.o.PodEnv(w, c, fields)
		if err != nil {
			t.Fatal(err)
		}
		local, err := in.o.Files(w, c, in.workDir(t, "restate-node"))
		if err != nil {
			t.Fatal(err)
		}
		env["RESTATE_CONFIG"], _ = local(env["RESTATE_CONFIG"])
		for k, v := range map[string]string{
			"RESTATE_BASE_DIR":                                               filepath.Join(dir, fmt.Sprint(i)),
			"RESTATE_BIND_ADDRESS":                                           fmt.Sprintf("127.0.0.1:%d", n.nodePort),
			"RESTATE_ADVERTISED_ADDRESS":                                     fmt.Sprintf("http://127.0.0.1:%d", n.nodePort),
			"RESTATE_ADMIN__BIND_ADDRESS":                                    fmt.Sprintf("127.0.0.1:%d", n.adminPort),
			"RESTATE_INGRESS__BIND_ADDRESS":                                  fmt.Sprintf("127.0.0.1:%d", n.ingressPort),
			"RESTATE_METADATA_CLIENT__ADDRESSES":                             "[" + strings.Join(addresses, ",") + "]",
			"RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE":                              "128MB",
			"RESTATE_WORKER__INVOKER__REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE": key,
		} {
			env[k] = v
		}
		var environ []string
		for k, v := range env {
			if strings.HasPrefix(k, "RESTATE_") {
				environ = append(environ, k+"="+v)
			}
		}
		if n.p, err = testenv.StartProcess(dir, fmt.Sprintf("restate-%d", i), testenv.RestateServerBin(), []string{"--no-logo"}, environ); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.p.Stop(10 * time.Second) })
	}
	probe := func(n node, p *corev1.Probe) string {
		if p == nil || p.HTTPGet == nil {
			return ""
		}
		ports := map[string]int{"node": n.nodePort, "admin": n.adminPort, "ingress": n.ingressPort}
		return fmt.Sprintf("http://127.0.0.1:%d%s", ports[p.HTTPGet.Port.StrVal], p.HTTPGet.Path)
	}
	waitProbe := func(what string, p *corev1.Probe) {
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		for i, n := range nodes {
			url := probe(n, p)
			if url == "" {
				continue
			}
			for !httpOK(ctx, url) {
				select {
				case <-n.p.Done():
					t.Fatalf("Restate node %d exited:\n%s", i, n.p.Tail(20))
				case <-ctx.Done():
					t.Fatalf("Restate node %d: the %s probe (%s) does not pass within %s:\n%s", i, what, url, waitBound, n.p.Tail(20))
				case <-time.After(250 * time.Millisecond):
				}
			}
		}
	}
	if w.Replicas > 1 {
		// The kubelet must not restart nodes waiting to be provisioned.
		waitProbe("liveness", c.LivenessProbe)
		bin := restatectlBin()
		if _, err := os.Stat(bin); err != nil {
			t.Fatal(&testenv.MissingBinaryError{Binary: "restatectl", Looked: bin, Fix: "run `make testenv` to install it from the npm registry"})
		}
		args := append(provisionCommand(t), "--address", fmt.Sprintf("http://127.0.0.1:%d", nodes[0].nodePort))
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		for {
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			if err == nil && strings.Contains(string(out), "provisioned") {
				t.Logf("restatectl %s: %s", strings.Join(args, " "), bytes.TrimSpace(out))
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("restatectl %s did not provision the cluster within %s: %v\n%s", strings.Join(args, " "), waitBound, err, out)
			case <-time.After(time.Second): // the nodes are still starting
			}
		}
	}
	waitProbe("readiness", c.ReadinessProbe)
	waitProbe("liveness", c.LivenessProbe)
	t.Logf("%d Restate node(s) pass their readiness and liveness probes", len(nodes))
}

func httpOK(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// identityKey writes a fresh ed25519 private key (PKCS#8 PEM, what
// `ctrl restate identity-key --create` and `openssl genpkey -algorithm
// ed25519` make) for Restate's request signing.
func identityKey(dir string) (string, error) {
	data, _, err := restateendpoint.NewIdentityKeyPEM()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "private.pem")
	return p, os.WriteFile(p, data, 0o600)
}
