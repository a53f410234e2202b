// Package bench measures what Krane exists for, each figure next to the
// limit it is compared with in the same run: propagation latency, bootstrap
// throughput against raw client-go server-side apply, resync cost, the
// plugin hop against an in-process call, memory, versions per second, watch
// bootstrap rows per second, and a fleet rollout against the pods' own
// readiness time. Figures are medians over repeats on a shared machine.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"krane.dev/internal/testenv/kubeenv"
)

// Print writes sections as a table.
func Print(w io.Writer, secs []Section) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tFIGURE\tVALUE\tTARGET\tNOTE")
	for _, s := range secs {
		for _, f := range s.Figures {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, f.Name, value(f), strings.ReplaceAll(target(f), "**", ""), f.Note)
		}
	}
	tw.Flush()
}

func cpus() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

// median of durations or floats.
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// percentile of sorted durations, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

// scrape reads a Prometheus text endpoint into series -> value.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// apiServerMetrics reads the API server's /metrics with the cluster's
// admin credentials (it serves TLS with its own CA).
func apiServerMetrics(ctx context.Context, c *kubeenv.Cluster) (map[string]float64, error) {
	body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	return parseMetrics(bytes.NewReader(body))
}

// profileAPIServer records the API server's CPU profile for d into
// $KRANE_BENCH_PROFILES/name.pprof, when that variable names a directory
// (go tool pprof reads it with the kube-apiserver binary). It returns at
// once; wait on the channel for the file.
func profileAPIServer(ctx context.Context, c *kubeenv.Cluster, name string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("KRANE_BENCH_PROFILES")
	if dir == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(int(d.Seconds()))).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pprof"), body, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: API server profile %s: %v\n", name, err)
		}
	}()
	return done
}

// parseMetrics reads the Prometheus text format into series -> value.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// sum adds the series whose name starts with prefix and contains every
// fragment.
func sum(m map[string]float64, prefix string, fragments ...string) float64 {
	var t float64
next:
	for k, v := range m {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		for _, f := range fragments {
			if !strings.Contains(k, f) {
				continue next
			}
		}
		t += v
	}
	return t
}

// procCPU is user+system CPU seconds of pids.
func procCPU(pids ...int) float64 {
	var total float64
	for _, pid := range pids {
		if st, ok := readProcStat(pid); ok {
			total += st.cpu
		}
	}
	return total
}

// procStat is what the bench reads of /proc/PID/stat.
type procStat struct {
	name string
	ppid int
	cpu  float64 // user+system seconds
}

func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	fields := strings.Fields(s[end+2:])
	ppid, _ := strconv.Atoi(fields[1])
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return procStat{name: s[open+1 : end], ppid: ppid, cpu: (ut + st) / 100}, true // clock ticks (USER_HZ = 100 on Linux)
}

// cpuByCommand is the CPU seconds used so far by every process on the
// machine, summed by command name (kube-apiserver, etcd, krane, ctrl,
// mariadbd...): the difference of two samples says where an interval's
// CPU went. Kernel threads (kthreadd, pid 2, and its children) are left
// out: they rename themselves with the work they do, so their counters
// cannot be compared by name.
func cpuByCommand() map[string]float64 {
	out := map[string]float64{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 2 {
			continue
		}
		if st, ok := readProcStat(pid); ok && st.ppid != 2 {
			out[st.name] += st.cpu
		}
	}
	return out
}

// apiCalls counts the API server's requests so far by verb and resource
// (apiserver_request_total).
func apiCalls(ctx context.Context, c *kubeenv.Cluster) (map[string]float64, error) {
	m, err := apiServerMetrics(ctx, c)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for series, v := range m {
		if !strings.HasPrefix(series, "apiserver_request_total{") {
			continue
		}
		key := label(series, "verb") + " " + label(series, "resource")
		if sub := label(series, "subresource"); sub != "" {
			key += "/" + sub
		}
		out[key] += v
	}
	return out, nil
}

// label is the value of one label of a Prometheus series.
func label(series, name string) string {
	i := strings.Index(series, name+`="`)
	if i < 0 || (i > 0 && series[i-1] != '{' && series[i-1] != ',') {
		return ""
	}
	rest := series[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

// apiCallsSince formats the requests made since an earlier count, most
// frequent first.
func apiCallsSince(ctx context.Context, c *kubeenv.Cluster, before map[string]float64) string {
	type use struct {
		key string
		n   float64
	}
	now, err := apiCalls(ctx, c)
	if err != nil {
		return err.Error()
	}
	var uses []use
	for k, v := range now {
		if d := v - before[k]; d >= 1 {
			uses = append(uses, use{k, d})
		}
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].n > uses[j].n })
	var parts []string
	for _, u := range uses {
		parts = append(parts, fmt.Sprintf("%s %.0f", u.key, u.n))
	}
	return strings.Join(parts, ", ")
}

// cpuSince formats where CPU went since an earlier sample, largest first
// (at least 0.1 CPU s each).
func cpuSince(before map[string]float64) string {
	type use struct {
		name string
		cpu  float64
	}
	var uses []use
	total := 0.0
	for name, cpu := range cpuByCommand() {
		if d := cpu - before[name]; d >= 0.1 {
			uses = append(uses, use{name, d})
			total += d
		}
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].cpu > uses[j].cpu })
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f CPU s:", total)
	for _, u := range uses {
		fmt.Fprintf(&b, " %s %.1f", u.name, u.cpu)
	}
	return b.String()
}

// procRSS is a process's resident set size in MiB.
func procRSS(pid int) float64 { return procMemory(pid).RSS }

// memUse is a process's resident memory in MiB: all of it, the anonymous
// part (heap, stacks) and the file-backed part (mostly executable text,
// which the process's own work does not change).
type memUse struct{ RSS, Anon, File float64 }

func procMemory(pid int) memUse {
	var m memUse
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || len(strings.Fields(v)) == 0 {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
		switch key {
		case "VmRSS":
			m.RSS = kb / 1024
		case "RssAnon":
			m.Anon = kb / 1024
		case "RssFile":
			m.File = kb / 1024
		}
	}
	return m
}

// commandName is the base name of a process's executable.
func commandName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return strconv.Itoa(pid)
	}
	return filepath.Base(strings.SplitN(string(b), "\x00", 2)[0])
}

// children lists (pid, command) of a process's children.
func children(parent int) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if ppid, _ := strconv.Atoi(fields[1]); ppid == parent && fields[0] != "Z" {
			out[pid] = s[strings.IndexByte(s, '(')+1 : strings.LastIndexByte(s, ')')]
		}
	}
	return out
}

// procRunnableWait is how long, in seconds, the process's threads have
// waited runnable but not running (the second field of
// /proc/PID/task/TID/schedstat, summed over its threads; 0 where the
// kernel does not keep it). Threads that exited take their share with
// them, so compare two samples of a process whose threads live on.
func procRunnableWait(pid int) float64 {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var ns float64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			ns += v
		}
	}
	return ns / 1e9
}
