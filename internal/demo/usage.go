package demo

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"krane.dev/internal/stack"
)

// Usage is what `make demo` prints once the scenario is done: how to use
// the running stack from another terminal, with every setting spelled out,
// so that the docs' commands run against it as written: the API clients
// (CTRL_ADDR, CTRL_TOKEN), `ctrl admin`, which reads ctrl's database
// (CTRL_DB_DSN), and each region's krane settings (its krane.hcl and
// KRANE_* variables, as `krane validate` reads them). e2e's
// TestDemoUsageRuns runs its commands.
func Usage(st *stack.Stack) string {
	var regions []string
	for r := range st.Clusters {
		regions = append(regions, r)
	}
	sort.Strings(regions)
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("\nThe stack keeps running. Use it from another terminal:\n\n")
	var path []string // where ctrl and krane are (make demo: both in bin/)
	for _, name := range []string{"ctrl", "krane"} {
		if dir := shellQuote(filepath.Dir(st.Bin(name))); !slices.Contains(path, dir) {
			path = append(path, dir)
		}
	}
	p("  export PATH=%s:\"$PATH\"\n", strings.Join(path, ":"))
	p("\nClients of ctrl's API (deploy, sentinel, rollout, fleet, kind, resource):\n\n")
	p("  export CTRL_ADDR=%s CTRL_TOKEN=%s\n", shellQuote(st.CtrlAddr), shellQuote(st.OperatorToken))
	p("  ctrl deploy list --environment %s\n", Environment)
	p("  ctrl deploy create --workspace w --project p --app a --environment staging --image nginx:1.27 --wait\n")
	p("  API_KEY=demo ctrl deploy create --workspace w --project p --app a --environment staging --image nginx:1.27 --secret-env API_KEY --wait\n")
	p("\nctrl admin (migrate, cluster, token, db) reads ctrl's database directly, with no token:\n\n")
	p("  export CTRL_DB_DSN=%s\n", shellQuote(st.DSN))
	p("  ctrl admin cluster list\n")
	p("  ctrl admin token list\n")
	p("  ctrl admin token create-operator --name ops\n")
	p("\nkrane, per region: its krane.hcl and the KRANE_* settings it runs with (`krane validate` reads both):\n\n")
	for _, r := range regions {
		hcl, err := st.KraneConfigPath(r)
		if err != nil {
			p("  %s: no krane.hcl: %v\n", r, err)
			continue
		}
		var env []string
		for _, kv := range st.KraneProcessEnv(r) {
			k, v, _ := strings.Cut(kv, "=")
			env = append(env, k+"="+shellQuote(v))
		}
		p("  env %s krane validate -c %s\n", strings.Join(env, " "), shellQuote(hcl))
	}
	p("\nWeb console (sign in with the CTRL_TOKEN above):\n  %s\n", st.ConsoleURL)
	p("\nMetrics and health:\n  ctrl   %s/metrics   %s/readyz\n", st.CtrlHTTP, st.CtrlHTTP)
	for _, r := range regions {
		p("  krane  %s/metrics   %s/readyz   (%s)\n", st.KraneHTTP[r], st.KraneHTTP[r], r)
	}
	p("\nKubeconfigs (admin) per region:\n")
	for _, r := range regions {
		p("  %s: kubectl --kubeconfig %s get pods -A\n", r, st.Clusters[r].Kubeconfig)
	}
	p("\nProcess logs: %s\nPress Ctrl-C to stop everything.\n", strings.TrimSuffix(st.Dir(), "/"))
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it (a DSN's
// parentheses, a path with spaces).
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:,=@+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
