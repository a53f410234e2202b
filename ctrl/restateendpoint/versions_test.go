package restateendpoint_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/internal/testenv"
)

func TestBaseAndLineOf(t *testing.T) {
	for v, want := range map[string]string{"v0.2.0": "/v0.2", "v0.3.0-dev.4+abc": "/v0.3", "v1.0.7": "/v1.0", "dev": "", "": ""} {
		if got := restateendpoint.Base(v); got != want {
			t.Errorf("Base(%q) = %q, want %q", v, got, want)
		}
	}
	for uri, want := range map[string]string{"http://ctrl-restate:9080/v0.2": "v0.2", "http://h:1/v0.2/": "v0.2", "http://h:1": "", "http://h:1/": "", "http://h:1/v0.2.1": "", "http://h:1/x": ""} {
		if got := restateendpoint.LineOf(uri); got != want {
			t.Errorf("LineOf(%q) = %q, want %q", uri, got, want)
		}
	}
}

// lineProbe is a service whose handlers answer with the line serving them;
// Wait blocks until release is closed, so an invocation stays pinned to
// the deployment it started on.
func lineProbe(name, line string, release <-chan struct{}) []restate.ServiceDefinition {
	return []restate.ServiceDefinition{restate.NewObject(name).
		Handler("Echo", restate.NewObjectHandler(func(ctx restate.ObjectContext, in string) (string, error) { return line + ":" + in, nil })).
		Handler("Wait", restate.NewObjectHandler(func(ctx restate.ObjectContext, in string) (string, error) {
			<-release
			return line + ":" + in, nil
		}))}
}

// TestLinesAreDeploymentsOfTheirOwn: a newer ctrl line registers beside an
// older one and takes the new invocations; an invocation the older line
// started finishes on the older line's code; the older line, registering
// again (a restart mid-roll), does not take the services back; requests
// for another line's path are refused unrun; and the older deployment is
// removed only once nothing runs on it.
func TestLinesAreDeploymentsOfTheirOwn(t *testing.T) {
	r := testenv.SharedRestate(t)
	ctx := context.Background()
	const name = "LineProbe"
	release := make(chan struct{})
	serve := func(line string) (string, *prometheus.Registry, []restate.ServiceDefinition) {
		t.Helper()
		services := lineProbe(name, line, release)
		reg := prometheus.NewRegistry()
		ep, err := restateendpoint.NewEndpoint(services, restateendpoint.EndpointOptions{Base: "/" + line, IdentityKeys: []string{r.IdentityKey()}, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		return testenv.ServeH2C(t, ep.Handler()), reg, services
	}
	call := func(handler, key string) string {
		t.Helper()
		var out string
		if err := r.Call(ctx, name+"/"+key+"/"+handler, "x", &out, nil); err != nil {
			t.Fatal(err)
		}
		return out
	}
	host2, _, v2 := serve("v0.2")
	host3, reg3, v3 := serve("v0.3")
	url2, url3 := host2+"/v0.2", host3+"/v0.3"

	if res, err := restateendpoint.Register(ctx, r.AdminURL(), url2, v2, restateendpoint.RegisterOptions{}); err != nil || res.Action != restateendpoint.RegisterCreated {
		t.Fatalf("register v0.2: %+v %v", res, err)
	}
	if got := call("Echo", "a"); got != "v0.2:x" {
		t.Fatalf("before the roll: %q", got)
	}
	var sent struct {
		InvocationID string `json:"invocationId"`
	}
	if err := r.Call(ctx, name+"/pinned/Wait/send", "x", &sent, nil); err != nil {
		t.Fatal(err)
	}
	waitDeployments(t, r, v2, func(d []restateendpoint.Deployment) bool { return len(d) == 1 && d[0].Pinned == 1 })

	res, err := restateendpoint.Register(ctx, r.AdminURL(), url3, v3, restateendpoint.RegisterOptions{})
	if err != nil || res.Action != restateendpoint.RegisterCreated {
		t.Fatalf("register v0.3: %+v %v", res, err)
	}
	if got := call("Echo", "b"); got != "v0.3:x" {
		t.Fatalf("after the roll, a new invocation ran on %q; want v0.3", got)
	}
	// A v0.2 replica restarting mid-roll registers again: it leaves the
	// services to v0.3.
	res, err = restateendpoint.Register(ctx, r.AdminURL(), url2, v2, restateendpoint.RegisterOptions{})
	if err != nil || res.Action != restateendpoint.RegisterUnchanged || !strings.Contains(res.Newer, url3) {
		t.Fatalf("v0.2 registering again after v0.3: %+v %v; want it left alone, naming v0.3", res, err)
	}
	if got := call("Echo", "c"); got != "v0.3:x" {
		t.Fatalf("after v0.2 registered again, a new invocation ran on %q", got)
	}
	// Restate reaching the v0.3 replica for v0.2's path is refused.
	resp, err := http.Get(host3 + "/v0.2/discover")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || testutil.ToFloat64(mustCounter(t, reg3)) != 1 {
		t.Fatalf("a request for v0.2's path at a v0.3 replica: %s; want 404 and it counted", resp.Status)
	}

	removed, remaining, err := restateendpoint.RemoveDrained(ctx, r.AdminURL(), url3, v3, nil)
	if err != nil || len(removed) != 0 {
		t.Fatalf("drain while v0.2 runs an invocation: removed %v, %v", removed, err)
	}
	for _, d := range remaining {
		if d.Line == "v0.2" && (d.Drained() || d.Pinned != 1 || len(d.Latest) != 0) {
			t.Fatalf("v0.2 while its invocation runs: %+v", d)
		}
	}
	close(release)
	resp, err = http.Get(r.IngressURL() + "/restate/invocation/" + sent.InvocationID + "/attach")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `"v0.2:x"` {
		t.Fatalf("the invocation v0.2 started finished with %s %q; want it run to the end on v0.2's code", resp.Status, body)
	}
	deps := waitDeployments(t, r, v3, func(d []restateendpoint.Deployment) bool {
		for _, x := range d {
			if x.Line == "v0.2" && !x.Drained() {
				return false
			}
		}
		return true
	})
	removed, _, err = restateendpoint.RemoveDrained(ctx, r.AdminURL(), url3, v3, nil)
	if err != nil || len(removed) != 1 || removed[0].Line != "v0.2" {
		t.Fatalf("drain once v0.2 finished: removed %+v, %v (deployments %+v)", removed, err, deps)
	}
	if got := call("Echo", "d"); got != "v0.3:x" {
		t.Fatalf("after the drain: %q", got)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "krane_ctrl_restate_misrouted_total" {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	c.Add(total)
	return c
}

// waitDeployments reads the deployments of services until ok holds.
func waitDeployments(t *testing.T, r *testenv.Restate, services []restate.ServiceDefinition, ok func([]restateendpoint.Deployment) bool) []restateendpoint.Deployment {
	t.Helper()
	var last []restateendpoint.Deployment
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		d, err := restateendpoint.Deployments(context.Background(), r.AdminURL(), services, nil)
		if err != nil {
			t.Fatal(err)
		}
		if last = d; ok(d) {
			return d
		}
	}
	t.Fatalf("deployments never got there: %+v", last)
	return nil
}
