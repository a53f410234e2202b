// Package bench measures what Krane exists for, each figure next to the
// limit it is compared with in the same run: propagation latency, bootstrap
// throughput against raw client-go server-side apply, resync cost, the
// plugin hop against an in-process call, memory, versions per second, watch
// bootstrap rows per second, and a fleet rollout against the pods' own
// readiness time. Figures are medians over repeats on a shared machine.
package bench

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
	"text/tabwriter"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/stack"
)

// Figure is one measured number.
type Figure struct {
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	Target  string  `json:"target,omitempty"`
	Note    string  `json:"note,omitempty"`
}

// Env is what measurements run against.
type Env struct {
	St     *stack.Stack
	Store  *store.Store
	Region string
	Out    io.Writer
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.Out, "    "+format+"\n", args...)
}

// Print writes figures as a table.
func Print(w io.Writer, figs []Figure) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tFIGURE\tVALUE\tTARGET\tNOTE")
	for _, f := range figs {
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s\t%s\n", f.Section, f.Name, format(f.Value), f.Unit, f.Target, f.Note)
	}
	tw.Flush()
}

func format(v float64) string {
	switch {
	case v != 0 && v < 0.01:
		return strconv.FormatFloat(v, 'g', 3, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// WriteJSON writes the figures to path.
func WriteJSON(path string, figs []Figure, started time.Time) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	host, _ := os.Hostname()
	_ = host
	b, err := json.MarshalIndent(map[string]any{
		"started": started.UTC().Format(time.RFC3339), "took_seconds": time.Since(started).Seconds(),
		"cpus": cpus(), "figures": figs,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
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
func scrape(ctx context.Context, url, token string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := http.DefaultClient
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
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
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseFloat(fields[11], 64)
		st, _ := strconv.ParseFloat(fields[12], 64)
		total += (ut + st) / 100 // clock ticks (USER_HZ = 100 on Linux)
	}
	return total
}

// procRSS is a process's resident set size in MiB.
func procRSS(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return kb / 1024
		}
	}
	return 0
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
