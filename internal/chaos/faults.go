package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// Settings the faults below rely on; Env sets them for every krane of a
// chaos run, CtrlEnv for ctrl.
const (
	// maxPending is the krane's read-ahead: parkPastMaxPending parks more.
	maxPending = 8
	// ctrl sends a keep-alive every ctrlKeepAlive on an idle stream; a
	// krane gives up on a stream silent for streamTimeout.
	ctrlKeepAlive = 2 * time.Second
	streamTimeout = 6 * time.Second
	// A plugin is declared hung after at most three liveness checks of
	// 5s, 5s apart (host/supervisor): a plugin stopped longer is replaced.
	hungFor = 32 * time.Second
)

// Env is the krane settings of a chaos run: leader election on (a region
// may get a second krane), and what the faults above need.
func Env() []string {
	return []string{
		"KRANE_SYNC__MAX_PENDING=" + fmt.Sprint(maxPending),
		"KRANE_SYNC__STREAM_TIMEOUT=" + streamTimeout.String(),
		"KRANE_LEADER_ELECTION__ENABLED=true",
		"KRANE_LEADER_ELECTION__LEASE_DURATION=4s",
		"KRANE_LEADER_ELECTION__RENEW_DEADLINE=3s",
		"KRANE_LEADER_ELECTION__RETRY_PERIOD=1s",
	}
}

// CtrlEnv is ctrl's settings of a chaos run.
func CtrlEnv() []string {
	return []string{"CTRL_WATCH_KEEPALIVE=" + ctrlKeepAlive.String()}
}

// hangPlugin stops one of a region's plugins (SIGSTOP) long enough for
// its supervisor to declare it hung, then lets it go on (SIGCONT) if it is
// still there.
func hangPlugin(ctx context.Context, r *run, region string) error {
	plugins := childPids(r.st.Krane(region).Pid())
	if len(plugins) == 0 {
		return nil
	}
	pid := plugins[r.rng.IntN(len(plugins))]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil // it just went
	}
	sleep(ctx, hungFor+time.Duration(r.rng.IntN(8000))*time.Millisecond)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil || isGone(pid) {
		r.logf("hung plugin %d was killed and replaced by its supervisor", pid)
		return nil
	}
	r.logf("hung plugin %d resumed before its supervisor replaced it", pid)
	return nil
}

// parkPastMaxPending commits more permanently failing changes (network
// policies in a namespace the cilium plugin refuses) than the krane reads
// ahead, waits until they are all parked while the other changes keep
// flowing, then deletes them.
func parkPastMaxPending(ctx context.Context, r *run, region string) error {
	n := maxPending + 4
	var ids []string
	for i := range n {
		id := fmt.Sprintf("chaos-poison-%s-%d", region, i)
		ids = append(ids, id)
		p := store.CiliumNetworkPolicy{ID: id, Region: region, K8sNamespace: "kube-system", K8sName: fmt.Sprintf("chaos-poison-%d", i),
			Policy: []byte(`{"endpointSelector":{"matchLabels":{"app":"poison"}},"ingress":[{}]}`)}
		if err := r.ch.write(ctx, func(ctx context.Context, tx *store.Tx) error { return tx.PutCiliumNetworkPolicy(ctx, p) }); err != nil {
			return err
		}
	}
	series := fmt.Sprintf(`krane_host_parked_objects{kind=%q}`, kinds.CiliumNetworkPolicy)
	err := until(ctx, 2*time.Minute, func() error {
		m, err := scrape(r.st.KraneHTTP[region] + "/metrics")
		if err != nil {
			return err
		}
		if m[series] < float64(n) {
			return fmt.Errorf("%v of %d parked", m[series], n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("poisoned policies not all parked: %w", err)
	}
	r.logf("%d policies parked past max_pending %d", n, maxPending)
	for i, id := range ids {
		p := store.CiliumNetworkPolicy{ID: id, Region: region, K8sNamespace: "kube-system", K8sName: fmt.Sprintf("chaos-poison-%d", i), Policy: []byte(`{}`), Deleted: true}
		if err := r.ch.write(ctx, func(ctx context.Context, tx *store.Tx) error { return tx.PutCiliumNetworkPolicy(ctx, p) }); err != nil {
			return err
		}
	}
	return nil
}

var urlLine = regexp.MustCompile(`(?m)^(\s*url\s*=\s*)"http://([^"]*)"`)

// reloadMissingCA reloads the region's krane with a ctrl connection it
// cannot build (https with a CA file that is not there): the reload must
// change nothing, the krane staying ready; then the file is put back.
func reloadMissingCA(ctx context.Context, r *run, region string) error {
	if err := r.ck.waitLeading(ctx, region); err != nil {
		return err
	}
	var original string
	missing := filepath.Join(r.st.Dir(), "ca-not-there-yet.pem")
	k := r.st.Krane(region)
	err := r.st.EditKraneConfig(region, func(s string) string {
		original = s
		return urlLine.ReplaceAllString(s, `${1}"https://${2}"`+"\n  ca_file = "+fmt.Sprintf("%q", missing))
	})
	if err != nil {
		return err
	}
	if original == "" || !urlLine.MatchString(original) {
		return errors.New("the region's krane.hcl has no control_plane url to edit")
	}
	err = until(ctx, time.Minute, func() error {
		if !strings.Contains(k.Tail(400), "reload not applied") {
			return errors.New("no refused reload in the krane's log yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if body, err := readyz(ctx, r.st.KraneHTTP[region]); err != nil || !strings.HasPrefix(body, "ready") {
		return fmt.Errorf("krane not ready after a refused reload: %q, %v", body, err)
	}
	return r.st.EditKraneConfig(region, func(string) string { return original })
}

// stallCtrl stops ctrl (SIGSTOP) for longer than a krane's stream
// timeout, then lets it go on: every stream is silent, none ends.
func stallCtrl(ctx context.Context, r *run, _ string) error {
	if err := r.st.SignalCtrl(syscall.SIGSTOP); err != nil {
		return err
	}
	sleep(ctx, streamTimeout+time.Duration(2000+r.rng.IntN(10000))*time.Millisecond)
	return r.st.SignalCtrl(syscall.SIGCONT)
}

// killLeaderMidApply starts a second krane for the region, which stands
// by, writes a burst of changes and kills the leader (SIGKILL) while it
// applies them. The standby takes the lease over and becomes the region's
// krane.
func killLeaderMidApply(ctx context.Context, r *run, region string) error {
	if err := r.ck.waitLeading(ctx, region); err != nil {
		return err
	}
	r.replicas++
	standby, err := r.st.StartKraneReplica(ctx, region, fmt.Sprintf("krane-%s-replica-%d", region, r.replicas))
	if err != nil {
		return fmt.Errorf("start a standby krane: %w", err)
	}
	if body, err := readyz(ctx, standby.HTTP); err != nil || !strings.HasPrefix(body, "standby") {
		standby.P.Kill()
		return fmt.Errorf("the second krane is not standing by: %q, %v", body, err)
	}
	for range 20 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = r.ch.step(wctx)
		cancel()
	}
	r.st.Krane(region).Kill()
	r.st.PromoteKrane(region, standby)
	return r.ck.measure(ctx, region)
}

// waitLeading waits until the region's krane leads and is ready.
func (c *checker) waitLeading(ctx context.Context, region string) error {
	return until(ctx, 2*time.Minute, func() error {
		body, err := readyz(ctx, c.st.KraneHTTP[region])
		if err != nil {
			return err
		}
		if !strings.HasPrefix(body, "ready") {
			return fmt.Errorf("krane %s: %s", region, strings.TrimSpace(body))
		}
		return nil
	})
}

// readyz returns a krane's /readyz body, or an error unless it is 200.
func readyz(ctx context.Context, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("readyz %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

// until polls cond every 200ms until it holds, ctx ends or bound passes.
func until(ctx context.Context, bound time.Duration, cond func() error) error {
	deadline := time.Now().Add(bound)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("after %s: %w", bound, err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// isGone reports whether pid has exited (a zombie counts).
func isGone(pid int) bool {
	_, state := procStatus(pid)
	return state == "Z"
}
