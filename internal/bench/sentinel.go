package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"krane.dev/internal/sentineltest"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/sentinel/proxy"
	"krane.dev/sentinel/routes"
)

// SentinelProxy measures what the sentinel's proxy adds to a request, on
// this machine's loopback, against two baselines measured in the same run:
// the backend asked directly, and a bare net/http/httputil reverse proxy.
// The sentinel is the data plane krane-sentinel runs (proxy.Router, with
// its access log on, written to nowhere), served by net/http like the
// others. Latency: one request at a time, rounds of the three arms
// interleaved so that the machine's load falls on all three alike.
// Throughput: 8 concurrent clients for a fixed time per arm, interleaved
// the same way.
func SentinelProxy(ctx context.Context, e *Env) ([]Figure, error) {
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") })}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = backend.Serve(bl) }()
	defer backend.Close()
	u := &url.URL{Scheme: "http", Host: bl.Addr().String()}

	bare := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	rt, err := proxy.NewRouter(proxy.Options{EnvironmentID: "env_bench", AccessLog: true,
		Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Info})})
	if err != nil {
		return nil, err
	}
	defer rt.Close()
	r := &routes.Routes{EnvironmentID: "env_bench", Version: 1, Hosts: []string{"bench.example.com"},
		Backend: &routes.Backend{DeploymentID: "dep_bench", Namespace: "ns", Service: "s"}}
	b := rt.NewBackend(*r.Backend)
	b.SetInstances([]string{u.Host})
	if err := rt.Apply(r, b); err != nil {
		return nil, err
	}
	arms := []struct {
		key, name string
		url       string
	}{{"direct", "the backend directly", u.String()}}
	for _, h := range []struct {
		key, name string
		h         http.Handler
	}{{"httputil", "a bare httputil.ReverseProxy", bare}, {"sentinel", "the sentinel", rt}} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: h.h}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		arms = append(arms, struct{ key, name, url string }{h.key, h.name, "http://" + l.Addr().String()})
	}

	rounds, perRound, window := e.size(10, 2), e.size(2000, 200), time.Duration(e.size(2000, 200))*time.Millisecond
	lat := map[string][]time.Duration{}
	done := map[string]int{}
	spent := map[string]time.Duration{}
	for round := range rounds {
		for _, a := range arms {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			for range perRound {
				begin := time.Now()
				if err := benchGet(ctx, client, a.url); err != nil {
					return nil, fmt.Errorf("%s: %w", a.name, err)
				}
				lat[a.key] = append(lat[a.key], time.Since(begin))
			}
			n, took, err := throughput(ctx, client, a.url, 8, window)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", a.name, err)
			}
			done[a.key] += n
			spent[a.key] += took
			client.CloseIdleConnections()
		}
		e.logf("sentinel proxy: round %d of %d", round+1, rounds)
	}
	var figs []Figure
	rps := map[string]float64{}
	p := map[string][2]time.Duration{}
	for _, a := range arms {
		rps[a.key] = float64(done[a.key]) / spent[a.key].Seconds()
		p[a.key] = [2]time.Duration{quantile(lat[a.key], 0.50), quantile(lat[a.key], 0.99)}
		figs = append(figs,
			Figure{Key: a.key + "_rps", Name: a.name + ": requests/s, 8 clients", Value: rps[a.key], Unit: "requests/s"},
			Figure{Key: a.key + "_p50", Name: a.name + ": latency p50, one request at a time", Value: us(p[a.key][0]), Unit: "µs"},
			Figure{Key: a.key + "_p99", Name: a.name + ": latency p99, one request at a time", Value: us(p[a.key][1]), Unit: "µs"})
	}
	figs = append(figs,
		Figure{Key: "added_p50", Name: "sentinel's added latency p50 (vs direct)", Value: us(p["sentinel"][0] - p["direct"][0]), Unit: "µs"},
		Figure{Key: "added_p99", Name: "sentinel's added latency p99 (vs direct)", Value: us(p["sentinel"][1] - p["direct"][1]), Unit: "µs", Target: Below(1000)},
		Figure{Key: "added_p99_vs_httputil", Name: "sentinel's latency p99 over the bare httputil proxy's", Value: us(p["sentinel"][1] - p["httputil"][1]), Unit: "µs"},
		Figure{Key: "throughput_ratio", Name: "sentinel's requests/s over the bare httputil proxy's", Value: rps["sentinel"] / rps["httputil"], Unit: "ratio", Target: AtLeast(0.8)})
	e.logf("sentinel proxy: p99 direct %s, httputil %s, sentinel %s; requests/s direct %.0f, httputil %.0f, sentinel %.0f",
		p["direct"][1], p["httputil"][1], p["sentinel"][1], rps["direct"], rps["httputil"], rps["sentinel"])
	return figs, nil
}

// waitDeploymentReady waits until a deployment is ready (what
// `ctrl deploy create --wait` waits for).
func waitDeploymentReady(ctx context.Context, api ctrlv1.DeploymentServiceClient, id string) error {
	deadline := time.Now().Add(5 * time.Minute)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		d, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		if err != nil {
			return err
		}
		switch d.GetStatus() {
		case ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY:
			return nil
		case ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED:
			return fmt.Errorf("deployment %s failed: %s", id, d.GetError())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment %s is %s after 5 minutes", id, d.GetStatus())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func benchGet(ctx context.Context, client *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/", nil)
	if err != nil {
		return err
	}
	req.Host = "bench.example.com"
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// throughput runs c clients against u for d and counts the requests done.
func throughput(ctx context.Context, client *http.Client, u string, c int, d time.Duration) (int, time.Duration, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		first error
	)
	begin := time.Now()
	stop := begin.Add(d)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for time.Now().Before(stop) {
				if err := benchGet(ctx, client, u); err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total, time.Since(begin), first
}

// quantile is the q-quantile of ds (unsorted), as a duration.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// SentinelSwitch measures how long a promote takes to move traffic: from
// the operator's Promote call (ctrl commits the new live deployment) to the
// first request a krane-sentinel answers from the promoted deployment,
// through ctrl, the krane host, the sentinel plugin's routes ConfigMap and
// the sentinel's watch. It runs its own one-region stack whose cluster has
// no EndpointSlice controller: internal/sentineltest plays it, with real
// servers for the simulated pods. Two deployments are promoted in turn; a
// client asks the sentinel one request after another meanwhile.
func SentinelSwitch(ctx context.Context, e *Env) ([]Figure, error) {
	st, err := stack.Start(ctx, stack.Options{BinDir: e.Bin, Regions: []string{"bench"}, Progress: e.Out,
		Kube: kubeenv.Options{Name: "switch"}, Traffic: true})
	if err != nil {
		return nil, fmt.Errorf("the stack did not start: %w", err)
	}
	defer st.Stop()
	ip, err := testenv.HostIPv4()
	if err != nil {
		return nil, err
	}
	mirror, err := sentineltest.StartMirror(st.Clusters["bench"], ip, 1, 0)
	if err != nil {
		return nil, err
	}
	defer mirror.Stop()
	conn, err := grpc.NewClient(st.CtrlAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(st.OperatorToken)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	api := ctrlv1.NewDeploymentServiceClient(conn)
	const env, host = "bench-switch", "switch.bench.test"
	var ids []string
	for i := range 2 {
		d, err := api.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{WorkspaceId: "bench", ProjectId: "p", AppId: "a", EnvironmentId: env,
			Workload: &clusterv1.Workload{Image: fmt.Sprintf("registry.local/bench/switch:%d", i+1)}, Replicas: 1, Regions: []string{"bench"}})
		if err != nil {
			return nil, err
		}
		if err := waitDeploymentReady(ctx, api, d.GetDeploymentId()); err != nil {
			return nil, err
		}
		ids = append(ids, d.GetDeploymentId())
	}
	if _, err := api.SetEnvironmentHosts(ctx, &ctrlv1.SetEnvironmentHostsRequest{EnvironmentId: env, Hosts: []string{host}}); err != nil {
		return nil, err
	}
	// The first deployment is live (the first ready one of the environment).
	dir, err := testenv.SubDir("bench-sentinel")
	if err != nil {
		return nil, err
	}
	ss, err := sentineltest.StartSentinels(ctx, st.Clusters["bench"], st.Bin("krane-sentinel"), dir, 1, ids[0], host)
	for _, s := range ss {
		defer s.Process.Stop(30 * time.Second)
	}
	if err != nil {
		return nil, err
	}
	s := ss[0]
	client := &http.Client{Timeout: 10 * time.Second}
	n := e.size(30, 3)
	var took []time.Duration
	for i := range n {
		to := ids[(i+1)%2]
		begin := time.Now()
		if _, err := api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: to}); err != nil {
			return nil, fmt.Errorf("promote %s: %w", to, err)
		}
		deadline := begin.Add(time.Minute)
		for {
			code, a, err := s.Get(ctx, client, host)
			if err != nil || code != http.StatusOK {
				return nil, fmt.Errorf("a request through the sentinel during promote %d: %d %v", i+1, code, err)
			}
			if a.Deployment == to {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("promote %d: the sentinel still answers from %s a minute after %s was promoted", i+1, a.Deployment, to)
			}
		}
		took = append(took, time.Since(begin))
	}
	if err := mirror.Err(); err != nil {
		return nil, err
	}
	p50, p99 := quantile(took, 0.50), quantile(took, 0.99)
	e.logf("sentinel switch: %d promotes, p50 %s, p99 %s", n, p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	return []Figure{
		{Key: "switch_p50", Name: fmt.Sprintf("promote to the first request served by the new deployment, %d promotes: p50", n), Value: ms(p50), Unit: "ms"},
		{Key: "switch_p99", Name: fmt.Sprintf("promote to the first request served by the new deployment, %d promotes: p99", n), Value: ms(p99), Unit: "ms", Target: Below(1000)},
	}, nil
}
