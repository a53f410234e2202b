package restateendpoint_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
)

// probe is a throwaway service (not ctrl's own, so other tests' routing
// on the shared Restate server is not disturbed).
func probe(name string, handlers ...string) []restate.ServiceDefinition {
	o := restate.NewObject(name)
	for _, h := range handlers {
		o = o.Handler(h, restate.NewObjectHandler(func(ctx restate.ObjectContext, in string) (string, error) { return h + ":" + in, nil }))
	}
	return []restate.ServiceDefinition{o}
}

// swappable serves whichever endpoint was set last: one URL whose code
// changes, as in an in-place upgrade of ctrl.
type swappable struct{ h atomic.Pointer[http.Handler] }

func (s *swappable) set(t *testing.T, services []restate.ServiceDefinition) {
	t.Helper()
	ep, err := restateendpoint.NewEndpoint(services, restateendpoint.EndpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := ep.Handler()
	s.h.Store(&h)
}

func (s *swappable) ServeHTTP(w http.ResponseWriter, r *http.Request) { (*s.h.Load()).ServeHTTP(w, r) }

func TestRegisterIsIdempotentAndForcesOnlyWhenStale(t *testing.T) {
	r := testenv.SharedRestate(t)
	ctx := context.Background()
	const name = "RegisterProbe"
	register := func(url string, services []restate.ServiceDefinition, force bool, want string) restateendpoint.RegisterResult {
		t.Helper()
		res, err := restateendpoint.Register(ctx, r.AdminURL(), url, services, restateendpoint.RegisterOptions{Force: force})
		if err != nil || res.Action != want {
			t.Fatalf("register %s: %+v, %v; want %q", url, res, err, want)
		}
		return res
	}
	call := func(handler, want string) {
		t.Helper()
		var out string
		if err := r.Call(ctx, name+"/k/"+handler, "x", &out, nil); err != nil || out != want {
			t.Fatalf("%s: %q, %v; want %q", handler, out, err, want)
		}
	}

	a := &swappable{}
	v1 := probe(name, "Echo")
	a.set(t, v1)
	urlA := testenv.ServeH2C(t, a)
	register(urlA, v1, false, restateendpoint.RegisterCreated)
	register(urlA+"/", v1, false, restateendpoint.RegisterUnchanged)
	call("Echo", "Echo:x")

	// In-place upgrade: same URL, a new handler. Without force Restate
	// would keep the old schema and answer 404 for it.
	v2 := probe(name, "Echo", "Shout")
	a.set(t, v2)
	if res := register(urlA, v2, false, restateendpoint.RegisterForced); !strings.Contains(res.Reason, "handlers differ") {
		t.Fatalf("reason %q, want the handler difference", res.Reason)
	}
	call("Shout", "Shout:x")
	register(urlA, v2, false, restateendpoint.RegisterUnchanged)

	// Another endpoint takes the service over; registering the first one
	// again takes it back, saying why.
	b := &swappable{}
	b.set(t, v2)
	urlB := testenv.ServeH2C(t, b)
	register(urlB, v2, false, restateendpoint.RegisterCreated)
	if res := register(urlA, v2, false, restateendpoint.RegisterForced); !strings.Contains(res.Reason, "registered after this endpoint") {
		t.Fatalf("reason %q, want the takeover", res.Reason)
	}
	register(urlA, v2, false, restateendpoint.RegisterUnchanged)
	register(urlA, v2, true, restateendpoint.RegisterForced)
}

// TestSignatureListsHandlersWithKinds: every handler is private to
// Restate's ingress but CtrlIngress.Call, ctrl's signed way in.
func TestSignatureListsHandlersWithKinds(t *testing.T) {
	sig := restateendpoint.Signature(workflows.Services(workflows.Deps{}))
	want := []string{
		"CtrlIngress(service).Call()",
		"DeployWorkflow(workflow).Notify(shared) private",
		"DeployWorkflow(workflow).Run(workflow) private",
		"SentinelRolloutService(virtualobject).BatchDone(exclusive) private",
		"SentinelRolloutService(virtualobject).Cancel(exclusive) private",
		"SentinelRolloutService(virtualobject).Resume(exclusive) private",
		"SentinelRolloutService(virtualobject).RollbackAll(exclusive) private",
		"SentinelRolloutService(virtualobject).Rollout(exclusive) private",
		"SentinelRolloutService(virtualobject).StartWave(exclusive) private",
		"SentinelRolloutService(virtualobject).Status(shared) private",
		"SentinelRolloutWorker(service).Run() private",
		"SentinelService(virtualobject).Deploy(exclusive) private",
		"SentinelService(virtualobject).NotifyFailed(shared) private",
		"SentinelService(virtualobject).NotifyReady(shared) private",
		"VersioningService(virtualobject).Stamp(exclusive) private",
	}
	if strings.Join(sig, ", ") != strings.Join(want, ", ") {
		t.Fatalf("signature\n%s\nwant\n%s", strings.Join(sig, "\n"), strings.Join(want, "\n"))
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }
