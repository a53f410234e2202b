package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"krane.dev/ctrl/store"
	"krane.dev/internal/stack"
)

var cnpGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

// checker compares every cluster with ctrl's desired state.
type checker struct {
	st         *stack.Stack
	s          *store.Store
	lookalikes []lookalike
	// baseline is each krane process's goroutines once it first led and
	// was ready, by pid.
	baseline map[int]int
}

// lookalike is an object that looks like Krane's but lacks its label: it
// must survive every GC and resync untouched.
type lookalike struct {
	region, kind, namespace, name string
	spec                          string // JSON of the spec as created
}

// mismatches lists every way the clusters differ from desired state, and
// every other broken promise (orphaned plugins, lagging cursors, workflows
// not terminal). Empty means converged.
func (c *checker) mismatches(ctx context.Context) []string {
	var out []string
	for _, region := range regions(c.st) {
		out = append(out, c.deployments(ctx, region)...)
		out = append(out, c.sentinels(ctx, region)...)
		out = append(out, c.policies(ctx, region)...)
		out = append(out, c.cursors(ctx, region)...)
	}
	out = append(out, c.untouched(ctx)...)
	out = append(out, c.orphans()...)
	out = append(out, c.workflows(ctx)...)
	sort.Strings(out)
	return out
}

func (c *checker) deployments(ctx context.Context, region string) []string {
	// The image is in the workload document (ctrl/store/workload.go).
	rows, err := c.s.DB().QueryContext(ctx, `SELECT d.id, COALESCE(JSON_UNQUOTE(JSON_EXTRACT(d.workload, '$.workload.image')), ''), t.desired_replicas, t.desired_status
FROM deployments d JOIN deployment_topology t ON t.deployment_id = d.id WHERE t.region = ? AND t.version > 0`, region)
	if err != nil {
		return []string{"read desired deployments: " + err.Error()}
	}
	defer rows.Close()
	want := map[string]string{} // id -> image@replicas, only those that must run
	for rows.Next() {
		var id, image, status string
		var replicas int32
		if err := rows.Scan(&id, &image, &replicas, &status); err != nil {
			return []string{err.Error()}
		}
		if status == "running" && replicas > 0 {
			want[id] = fmt.Sprintf("%s@%d", image, replicas)
		}
	}
	list, err := c.st.Clusters[region].Client.AppsV1().ReplicaSets("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=deployment"})
	if err != nil {
		return []string{region + ": list ReplicaSets: " + err.Error()}
	}
	have := map[string][]string{}
	for _, rs := range list.Items {
		if rs.DeletionTimestamp != nil {
			continue
		}
		id := rs.Labels["unkey.com/deployment.id"]
		have[id] = append(have[id], fmt.Sprintf("%s@%d", rs.Spec.Template.Spec.Containers[0].Image, *rs.Spec.Replicas))
	}
	return compare(region, "deployment", want, have)
}

func (c *checker) sentinels(ctx context.Context, region string) []string {
	rows, err := c.s.DB().QueryContext(ctx, `SELECT id, image, replicas, desired_state FROM sentinels WHERE region = ? AND version > 0`, region)
	if err != nil {
		return []string{"read desired sentinels: " + err.Error()}
	}
	defer rows.Close()
	want := map[string]string{}
	for rows.Next() {
		var id, image, state string
		var replicas int32
		if err := rows.Scan(&id, &image, &replicas, &state); err != nil {
			return []string{err.Error()}
		}
		if state == "running" {
			want[id] = fmt.Sprintf("%s@%d", image, replicas)
		}
	}
	list, err := c.st.Clusters[region].Client.AppsV1().Deployments("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=sentinel"})
	if err != nil {
		return []string{region + ": list Deployments: " + err.Error()}
	}
	have := map[string][]string{}
	for _, d := range list.Items {
		if d.DeletionTimestamp != nil {
			continue
		}
		id := d.Labels["unkey.com/sentinel.id"]
		have[id] = append(have[id], fmt.Sprintf("%s@%d", d.Spec.Template.Spec.Containers[0].Image, *d.Spec.Replicas))
	}
	return compare(region, "sentinel", want, have)
}

func (c *checker) policies(ctx context.Context, region string) []string {
	rows, err := c.s.DB().QueryContext(ctx, `SELECT id, policy, deleted FROM cilium_network_policies WHERE region = ? AND version > 0`, region)
	if err != nil {
		return []string{"read desired policies: " + err.Error()}
	}
	defer rows.Close()
	want := map[string]string{}
	for rows.Next() {
		var id, policy string
		var deleted bool
		if err := rows.Scan(&id, &policy, &deleted); err != nil {
			return []string{err.Error()}
		}
		if !deleted {
			want[id] = policyPort(policy)
		}
	}
	list, err := c.st.Clusters[region].Dynamic.Resource(cnpGVR).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=ciliumnetworkpolicy"})
	if err != nil {
		return []string{region + ": list policies: " + err.Error()}
	}
	have := map[string][]string{}
	for _, p := range list.Items {
		if p.GetDeletionTimestamp() != nil {
			continue
		}
		id := p.GetLabels()["unkey.com/networkpolicy.id"]
		spec, _, _ := unstructured.NestedMap(p.Object, "spec")
		b, _ := json.Marshal(spec)
		have[id] = append(have[id], policyPort(string(b)))
	}
	return compare(region, "policy", want, have)
}

// policyPort is what the churn varies in a policy: its port.
func policyPort(policy string) string {
	i := strings.Index(policy, `"port":"`)
	if i < 0 {
		return "?"
	}
	rest := policy[i+len(`"port":"`):]
	return rest[:strings.IndexByte(rest, '"')]
}

func compare(region, kind string, want map[string]string, have map[string][]string) []string {
	var out []string
	for id, w := range want {
		switch h := have[id]; {
		case len(h) == 0:
			out = append(out, fmt.Sprintf("%s: %s %s missing (want %s)", region, kind, id, w))
		case len(h) > 1:
			out = append(out, fmt.Sprintf("%s: %s %s has %d objects %v", region, kind, id, len(h), h))
		case h[0] != w:
			out = append(out, fmt.Sprintf("%s: %s %s is %s, want %s", region, kind, id, h[0], w))
		}
	}
	for id, h := range have {
		if _, ok := want[id]; !ok {
			out = append(out, fmt.Sprintf("%s: %s %s exists (%v) but is not desired", region, kind, id, h))
		}
	}
	return out
}

// cursors: every kind's committed cursor has reached ctrl's head for the
// region (read from krane's metrics and ctrl's change_heads).
func (c *checker) cursors(ctx context.Context, region string) []string {
	heads, err := c.s.ChangeHeads(ctx)
	if err != nil {
		return []string{"read change heads: " + err.Error()}
	}
	metrics, err := scrape(c.st.KraneHTTP[region] + "/metrics")
	if err != nil {
		return []string{region + ": scrape krane: " + err.Error()}
	}
	var out []string
	for k, head := range heads {
		if k.Region != region {
			continue
		}
		cursor, ok := metrics[fmt.Sprintf(`krane_host_cursor{kind=%q}`, k.Kind)]
		if !ok || uint64(cursor) < head {
			out = append(out, fmt.Sprintf("%s: %s cursor %v behind ctrl's head %d", region, k.Kind, cursor, head))
		}
	}
	return out
}

func (c *checker) untouched(ctx context.Context) []string {
	var out []string
	for _, l := range c.lookalikes {
		var o metav1.Object
		var spec any
		var err error
		cl := c.st.Clusters[l.region]
		switch l.kind {
		case "ReplicaSet":
			var rs *appsv1.ReplicaSet
			rs, err = cl.Client.AppsV1().ReplicaSets(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
			if err == nil {
				o, spec = rs, rs.Spec
			}
		case "CiliumNetworkPolicy":
			var u *unstructured.Unstructured
			u, err = cl.Dynamic.Resource(cnpGVR).Namespace(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
			if err == nil {
				o, spec = u, u.Object["spec"]
			}
		}
		if err != nil {
			out = append(out, fmt.Sprintf("%s: look-alike %s %s/%s without Krane's label was removed: %v", l.region, l.kind, l.namespace, l.name, err))
			continue
		}
		// Controllers update status (and resourceVersion); Krane may not
		// touch the object at all: no field of it may be Krane's, and its
		// spec must be what the test wrote.
		for _, mf := range o.GetManagedFields() {
			if mf.Manager == "krane" {
				out = append(out, fmt.Sprintf("%s: look-alike %s %s/%s was written by Krane", l.region, l.kind, l.namespace, l.name))
			}
		}
		if got, _ := json.Marshal(spec); string(got) != l.spec {
			out = append(out, fmt.Sprintf("%s: look-alike %s %s/%s spec changed", l.region, l.kind, l.namespace, l.name))
		}
	}
	return out
}

// orphans: every plugin process has a live krane as its parent.
func (c *checker) orphans() []string {
	kranes := map[int]bool{}
	for _, r := range regions(c.st) {
		kranes[c.st.Krane(r).Pid()] = true
	}
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "krane-plugin-") || !strings.Contains(string(cmd), c.st.Dir()) {
			continue
		}
		ppid, state := procStatus(pid)
		if state == "Z" {
			continue
		}
		if !kranes[ppid] {
			out = append(out, fmt.Sprintf("plugin process %d (%s) is orphaned (parent %d)", pid, strings.ReplaceAll(string(cmd), "\x00", " "), ppid))
		}
	}
	return out
}

func procStatus(pid int) (ppid int, state string) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, "Z"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(line, "State:"); ok {
			state = strings.Fields(v)[0]
		}
	}
	return ppid, state
}

// workflows: every deploy started through the API has ended.
func (c *checker) workflows(ctx context.Context) []string {
	rows, err := c.s.DB().QueryContext(ctx, `SELECT id, status FROM deployments WHERE id LIKE 'dep\_%' AND status NOT IN ('ready','failed','stopped')`)
	if err != nil {
		return []string{"read deploy statuses: " + err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return []string{err.Error()}
		}
		out = append(out, fmt.Sprintf("deploy workflow %s is still %s", id, status))
	}
	return out
}

func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}

func regions(st *stack.Stack) []string {
	var rs []string
	for r := range st.Clusters {
		rs = append(rs, r)
	}
	sort.Strings(rs)
	return rs
}

// goroutineAllowance is how many goroutines a krane may have beyond its
// count after its start without that being called a leak: a resync pass,
// a batch of reports or a reconnect may be under way when it is read.
const goroutineAllowance = 40

// measure records the goroutines of a region's krane once it leads and is
// ready: the count the end of the run compares with.
func (c *checker) measure(ctx context.Context, region string) error {
	if err := c.waitLeading(ctx, region); err != nil {
		return err
	}
	n, err := c.goroutinesNow(ctx, region)
	if err != nil {
		return err
	}
	c.baseline[c.st.Krane(region).Pid()] = n
	return nil
}

// goroutinesNow is the lowest go_goroutines of a region's krane over a
// few samples (passes come and go between them).
func (c *checker) goroutinesNow(ctx context.Context, region string) (int, error) {
	low := -1
	for range 5 {
		m, err := scrape(c.st.KraneHTTP[region] + "/metrics")
		if err != nil {
			return 0, fmt.Errorf("%s: scrape krane: %w", region, err)
		}
		if n := int(m["go_goroutines"]); low < 0 || n < low {
			low = n
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return low, nil
}

// goroutines compares a region's krane's goroutines now with its count
// after its start, and returns how many are past the allowance.
func (c *checker) goroutines(ctx context.Context, region string) (start, now, leaked int, err error) {
	pid := c.st.Krane(region).Pid()
	start, ok := c.baseline[pid]
	if !ok {
		return 0, 0, 0, fmt.Errorf("%s: no goroutine count of krane %d after its start", region, pid)
	}
	if now, err = c.goroutinesNow(ctx, region); err != nil {
		return 0, 0, 0, err
	}
	return start, now, max(0, now-start-goroutineAllowance), nil
}

// processes lists processes that should not exist: a krane of the stack
// besides each region's one, and plugins beyond one per enabled
// controller of a leading krane (orphans are found by orphans).
func (c *checker) processes() []string {
	kranes := map[int]string{}
	for _, r := range regions(c.st) {
		kranes[c.st.Krane(r).Pid()] = r
	}
	var out []string
	for _, pid := range allPids() {
		cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), c.st.Dir()) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if _, state := procStatus(pid); state == "Z" || filepath.Base(args[0]) != "krane" {
			continue
		}
		region, ok := kranes[pid]
		if !ok {
			out = append(out, fmt.Sprintf("krane process %d (%s) is not any region's krane", pid, strings.Join(args, " ")))
			continue
		}
		if n := len(childPids(pid)); n != len(builtInControllers) {
			out = append(out, fmt.Sprintf("%s: krane %d runs %d plugin processes, want %d", region, pid, n, len(builtInControllers)))
		}
	}
	return out
}

// builtInControllers are the controllers krane.hcl enables.
var builtInControllers = []string{"deployment", "sentinel", "cilium"}
