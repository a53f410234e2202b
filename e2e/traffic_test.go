package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"krane.dev/internal/sentineltest"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

// TestSentinelRoutesRealRequests sends real HTTP requests through real
// krane-sentinel processes to real backend servers, on a stack whose
// deploys, promotes and rollbacks go through ctrl and krane as an
// operator's would. Simulated nodes run nothing, so the test plays the
// part of the kubelet and of Kubernetes' EndpointSlice controller (which
// the cluster runs without): for every ready pod of a deployment it starts
// an HTTP server that answers with the pod's name, and lists it in an
// EndpointSlice of the deployment's Service. The sentinels run as the
// account pods.yaml grants, so the test also proves those rights suffice.
//
// Under a constant, bounded request loop: a promote and a rollback move
// every later request to the new live deployment with no failed request;
// an instance whose health check fails gets no request once the sentinels
// saw it leave; an instance that dies unannounced costs no request either.
func TestSentinelRoutesRealRequests(t *testing.T) {
	st := trafficStack(t)
	cluster := st.Clusters["local-a"]
	seed := time.Now().UnixNano()
	t.Logf("seed %d (backend delays)", seed)
	mirror, err := sentineltest.StartMirror(cluster, testenv.HostIP(t), seed, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mirror.Stop()
		if err := mirror.Err(); err != nil {
			t.Errorf("endpoint mirror: %v", err)
		}
	})

	const env, host = "e2e-traffic", "app.e2e.test"
	a := trafficDeploy(t, st, env, "registry.local/e2e/traffic:1")
	if code, out, errOut := ctrlRun(t, st, "", "environment", "hosts", env, "--host", host); code != 0 {
		t.Fatalf("environment hosts: exit %d\n%s%s", code, out, errOut)
	}
	sentinels, err := sentineltest.StartSentinels(context.Background(), cluster, st.Bin("krane-sentinel"), t.TempDir(), 2, a, host)
	for i, s := range sentinels {
		t.Cleanup(func() {
			s.Process.Stop(30 * time.Second)
			if t.Failed() {
				t.Logf("krane-sentinel-%d:\n%s", i, s.Process.Tail(40))
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	load := startLoad(t, sentinels, host)

	// A promote: every request a sentinel starts after it first answered
	// from b is answered from b.
	b := trafficDeploy(t, st, env, "registry.local/e2e/traffic:2")
	load.expect(t, a)
	promoted := time.Now()
	if code, out, errOut := ctrlRun(t, st, "", "deploy", "promote", b); code != 0 {
		t.Fatalf("promote: exit %d\n%s%s", code, out, errOut)
	}
	switched := load.switchTo(t, b)
	t.Logf("promote: ctrl deploy promote returned to the last sentinel serving %s: %s", b, switched.Sub(promoted).Round(time.Millisecond))

	// A rollback: a new live deployment with a's configuration.
	rb := ctrlJSON(t, st, "", "deploy", "rollback", "--environment", env, "--wait")
	c, _ := rb["id"].(string)
	if c == "" || rb["live"] != true {
		t.Fatalf("rollback: %v", rb)
	}
	load.switchTo(t, c)

	// An instance fails its health check: Kubernetes would mark it not
	// ready in the slice. Once every sentinel counts one ready instance
	// fewer, none routes a request to it, although it still answers.
	pods := mirror.PodsOf(c)
	if len(pods) != 2 {
		t.Fatalf("deployment %s has instances %v, want 2", c, pods)
	}
	unhealthy := pods[0]
	if err := mirror.SetReady(unhealthy, false); err != nil {
		t.Fatal(err)
	}
	seen := waitInstancesReady(t, sentinels, c, 1)
	load.noneAfter(t, unhealthy, seen)

	// The other dies without notice: its connections are refused while
	// the slice still lists it. No request fails meanwhile: a refused
	// connect ejects the instance and the request moves to the healthy
	// one (checked with every other request at the end).
	if err := mirror.SetReady(unhealthy, true); err != nil {
		t.Fatal(err)
	}
	waitInstancesReady(t, sentinels, c, 2)
	if err := mirror.Kill(pods[1]); err != nil {
		t.Fatal(err)
	}
	load.waitPast(t, time.Now())

	failures := load.stop()
	t.Logf("%d requests through %d sentinels, %d failed", load.total(), len(sentinels), len(failures))
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... %d more", len(failures)-10)
			break
		}
		t.Errorf("failed request: %s", f)
	}
}

// trafficStack is a stack of one region whose cluster runs no
// EndpointSlice controller: the test writes the slices.
func trafficStack(t *testing.T) *stack.Stack {
	t.Helper()
	st, err := stack.Start(context.Background(), stack.Options{
		Regions:  []string{"local-a"},
		BinDir:   os.Getenv("KRANE_BIN_DIR"),
		Kube:     kubeenv.Options{Name: "traffic"},
		Traffic:  true,
		Progress: &lineWriter{t: t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Stop)
	return st
}

// trafficDeploy deploys two replicas to local-a and waits until ready.
func trafficDeploy(t *testing.T, st *stack.Stack, env, image string) string {
	t.Helper()
	doc := ctrlJSON(t, st, "", "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a", "--environment", env,
		"--image", image, "--replicas", "2", "--region", "local-a", "--wait")
	if doc["status"] != "DEPLOYMENT_STATUS_READY" {
		t.Fatalf("deploy of %s: %v", image, doc)
	}
	return doc["id"].(string)
}

// waitInstancesReady waits until every sentinel counts n ready instances
// of deployment id (its metric), and returns when the last one did.
func waitInstancesReady(t *testing.T, ss []*sentineltest.Sentinel, id string, n int) time.Time {
	t.Helper()
	for _, s := range ss {
		waitFor(t, time.Minute, fmt.Sprintf("%s counting %d ready instances of %s", s.Admin, n, id), func() error {
			got, err := s.InstancesReady(context.Background(), id)
			if err == nil && got != n {
				err = fmt.Errorf("%d", got)
			}
			return err
		})
	}
	return time.Now()
}

// load sends requests through the sentinels from four workers (two per
// sentinel), each one at a time, 100 a second at most.
type load struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu      sync.Mutex
	results []result
}

type result struct {
	sentinel   int
	start, end time.Time
	code       int
	answer     sentineltest.Answer
	err        error
}

func (r result) String() string {
	return fmt.Sprintf("sentinel %d at %s: code %d %+v %v", r.sentinel, r.start.Format("15:04:05.000"), r.code, r.answer, r.err)
}

func startLoad(t *testing.T, ss []*sentineltest.Sentinel, host string) *load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for w := range 4 {
		s := w % len(ss)
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				r := result{sentinel: s, start: time.Now()}
				r.code, r.answer, r.err = ss[s].Get(ctx, client, host)
				if ctx.Err() != nil {
					return // the loop stopped mid-request: not a failure
				}
				r.end = time.Now()
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() { l.stop() })
	return l
}

// expect waits until each sentinel has answered from deployment id.
func (l *load) expect(t *testing.T, id string) time.Time {
	t.Helper()
	var last time.Time
	for s := range 2 {
		waitFor(t, time.Minute, fmt.Sprintf("sentinel %d serving %s", s, id), func() error {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, r := range l.results {
				if r.sentinel == s && r.answer.Deployment == id {
					if r.end.After(last) {
						last = r.end
					}
					return nil
				}
			}
			return fmt.Errorf("not yet")
		})
	}
	return last
}

// switchTo waits until each sentinel answers from id, then checks that
// every request a sentinel started after its first answer from id was
// answered from id. It returns when the last sentinel first answered.
func (l *load) switchTo(t *testing.T, id string) time.Time {
	t.Helper()
	last := l.expect(t, id)
	// Requests started until now are settled once the workers move on.
	l.waitPast(t, time.Now())
	l.mu.Lock()
	defer l.mu.Unlock()
	first := map[int]time.Time{}
	for _, r := range l.results {
		if r.answer.Deployment == id && (first[r.sentinel].IsZero() || r.end.Before(first[r.sentinel])) {
			first[r.sentinel] = r.end
		}
	}
	for _, r := range l.results {
		if f, ok := first[r.sentinel]; ok && r.start.After(f) && r.err == nil && r.answer.Deployment != id {
			t.Errorf("after sentinel %d switched to %s at %s: %s", r.sentinel, id, f.Format("15:04:05.000"), r)
		}
	}
	return last
}

// waitPast waits until every worker has recorded a request that started
// after at.
func (l *load) waitPast(t *testing.T, at time.Time) {
	t.Helper()
	waitFor(t, time.Minute, "the request loop to move past "+at.Format("15:04:05.000"), func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := 0
		for _, r := range l.results {
			if r.start.After(at) {
				n++
			}
		}
		if n < 8 {
			return fmt.Errorf("%d requests since", n)
		}
		return nil
	})
}

// noneAfter checks that no request started after at was answered by pod
// (once the request loop has moved past at).
func (l *load) noneAfter(t *testing.T, pod string, at time.Time) {
	t.Helper()
	l.waitPast(t, at)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.results {
		if r.start.After(at) && r.answer.Pod == pod {
			t.Errorf("routed to %s after it left the ready set at %s: %s", pod, at.Format("15:04:05.000"), r)
		}
	}
}

func (l *load) stop() []result {
	l.cancel()
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	var failed []result
	for _, r := range l.results {
		if r.err != nil || r.code != http.StatusOK {
			failed = append(failed, r)
		}
	}
	return failed
}

func (l *load) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.results)
}
