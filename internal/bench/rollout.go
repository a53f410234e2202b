package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rollout rolls 200 sentinels (one pod each) to a new image in 5 waves
// (1,5,25,50,100%; a smoke run: 10 in 2 waves) on the simulated cluster
// and compares the total time
// with the sum of the waves' own pod readiness times: from the first new
// ReplicaSet of a wave to the last new pod of the wave being Ready, as
// observed by a watch. The difference is what Krane and ctrl add.
func Rollout(ctx context.Context, e *Env) ([]Figure, error) {
	n, waves := e.size(200, 10), []int{1, 5, 25, 50, 100}
	if e.Small {
		waves = []int{50, 100}
	}
	// Each wave's size: the sentinels it adds to those rolled before.
	var sizes []int
	var waveArg []string
	done := 0
	for _, p := range waves {
		upto := (n*p + 99) / 100
		sizes = append(sizes, upto-done)
		done = upto
		waveArg = append(waveArg, strconv.Itoa(p))
	}
	const v1, v2 = "registry.local/bench/sentinel:1", "registry.local/bench/sentinel:2"
	c := e.St.Clusters[e.Region]
	if err := (bulk{e.Store.DB()}).sentinels(ctx, e.Region, "roll", n); err != nil {
		return nil, err
	}
	// Wait until the cluster reports them all healthy on v1.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var healthy int
		err := e.Store.DB().QueryRowContext(ctx, `SELECT COUNT(DISTINCT id) FROM object_reports WHERE kind = 'sentinel' AND id LIKE 'roll-%'
  AND JSON_VALUE(status, '$.health') = 'HEALTH_HEALTHY' AND JSON_VALUE(status, '$.running_image') = ?`, v1).Scan(&healthy)
		if err != nil {
			return nil, err
		}
		if healthy == n {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d sentinels healthy on the first image after 5 minutes", healthy, n)
		}
		time.Sleep(time.Second)
	}
	// Only the bench sentinels may roll: the others (created by earlier
	// measurements' deploys) are stopped first.
	if _, err := e.Store.DB().ExecContext(ctx, `UPDATE sentinels SET desired_state = 'stopped' WHERE id NOT LIKE 'roll-%'`); err != nil {
		return nil, err
	}

	type timing struct{ newRS, ready time.Time }
	var mu sync.Mutex
	times := map[string]*timing{}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	rsw, err := c.Client.AppsV1().ReplicaSets("sentinel").Watch(wctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
	if err != nil {
		return nil, err
	}
	depw, err := c.Client.AppsV1().Deployments("sentinel").Watch(wctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
	if err != nil {
		return nil, err
	}
	go func() {
		for ev := range rsw.ResultChan() {
			rs, ok := ev.Object.(*appsv1.ReplicaSet)
			if !ok || rs.Spec.Template.Spec.Containers[0].Image != v2 {
				continue
			}
			id := rs.Labels["unkey.com/sentinel.id"]
			mu.Lock()
			if times[id] == nil {
				times[id] = &timing{newRS: time.Now()}
			}
			mu.Unlock()
		}
	}()
	go func() {
		for ev := range depw.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || d.Spec.Template.Spec.Containers[0].Image != v2 || !rolledOut(d) {
				continue
			}
			id := d.Labels["unkey.com/sentinel.id"]
			mu.Lock()
			if t := times[id]; t != nil && t.ready.IsZero() {
				t.ready = time.Now()
			}
			mu.Unlock()
		}
	}()

	begin := time.Now()
	out, err := e.St.Ctrl(ctx, "rollout", "start", "--image", v2, "--waves", strings.Join(waveArg, ","), "--watch", "-o", "json")
	total := time.Since(begin)
	if err != nil {
		return nil, err
	}
	var status struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(out, &status)
	if status.State != "completed" {
		return nil, fmt.Errorf("rollout ended %q:\n%s", status.State, out)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	var ts []*timing
	for _, t := range times {
		if !t.ready.IsZero() {
			ts = append(ts, t)
		}
	}
	if len(ts) < n {
		return nil, fmt.Errorf("saw %d of %d sentinels roll", len(ts), n)
	}
	spans := make([]span, len(ts))
	for i, t := range ts {
		spans[i] = span{t.newRS, t.ready}
	}
	podTime := unionLength(spans)
	e.logf("rollout: %d sentinels in %d waves: %s total, %s of it with Kubernetes rolling out at least one sentinel", n, len(sizes), total.Round(10*time.Millisecond), podTime.Round(10*time.Millisecond))
	return []Figure{
		{Key: "total", Name: fmt.Sprintf("%d sentinels, %d waves (%s): total", n, len(sizes), strings.Trim(strings.Join(strings.Fields(fmt.Sprint(sizes)), "/"), "[]")), Value: total.Seconds(), Unit: "s"},
		{Key: "kubernetes", Name: "time Kubernetes was rolling out at least one sentinel", Value: podTime.Seconds(), Unit: "s", Note: "the union over sentinels of first new ReplicaSet -> Deployment rolled out (minReadySeconds 5 included); overlapping waves count once"},
		{Key: "overhead", Name: "time no sentinel was rolling out: what Krane and ctrl add", Value: (total - podTime).Seconds(), Unit: "s", Note: "reports, wake-ups, wave hand-offs, CLI; never negative (every span lies within the total)"},
	}, nil
}

// span is an interval of time.
type span struct{ from, to time.Time }

// unionLength is the time covered by at least one span: overlapping
// spans count once, so it never exceeds the time from the first start to
// the last end.
func unionLength(spans []span) time.Duration {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	var total time.Duration
	var cur span
	for i, s := range spans {
		switch {
		case i == 0:
			cur = s
		case !s.from.After(cur.to):
			if s.to.After(cur.to) {
				cur.to = s.to
			}
		default:
			total += cur.to.Sub(cur.from)
			cur = s
		}
	}
	if len(spans) > 0 {
		total += cur.to.Sub(cur.from)
	}
	return total
}

// rolledOut: Kubernetes finished the Deployment's rollout (every replica
// updated and available, minReadySeconds included, old pods gone).
func rolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.AvailableReplicas == want && s.Replicas == want
}
