package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"krane.dev/internal/stack"
)

// TestTwoClustersRunDifferentPluginVersions: each cluster's krane.hcl pins
// its own build of a plugin (path and sha256), so two clusters run two
// versions of one plugin at once; upgrading one cluster (a new path and
// pin, then a reload) restarts that cluster's plugin only, and the other
// cluster's plugin process keeps running. docs/operating.md describes
// these steps.
func TestTwoClustersRunDifferentPluginVersions(t *testing.T) {
	st := sharedStack(t)
	ctx := context.Background()
	regions := []string{"local-a", "local-b"}
	dir := authorModule(t)
	env := walkEnv(t, st, "local-a")

	// Two releases of the quota plugin, each in a directory of its own (as
	// an image or a volume would ship them).
	builds := map[string]string{} // version -> binary
	pins := map[string]string{}
	for _, v := range []string{"1.0.0", "1.1.0"} {
		bin := filepath.Join(t.TempDir(), "quota-"+v, "krane-plugin-quota")
		runIn(t, dir, env, "go", "build", "-ldflags", "-X krane.dev/sdk.version="+v, "-o", bin, ".")
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		builds[v], pins[v] = bin, hex.EncodeToString(sum[:])
	}
	rbac, err := os.ReadFile(filepath.Join(dir, "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	originals := map[string]string{}
	for _, r := range regions {
		if err := st.Clusters[r].ApplyYAML(ctx, rbac); err != nil {
			t.Fatal(err)
		}
		if err := st.Clusters[r].EnsureNamespace(ctx, "team-up"); err != nil {
			t.Fatal(err)
		}
		hcl, _ := st.KraneConfigPath(r)
		b, err := os.ReadFile(hcl)
		if err != nil {
			t.Fatal(err)
		}
		originals[r] = string(b)
	}
	t.Cleanup(func() {
		for _, r := range regions {
			_ = st.EditKraneConfig(r, func(string) string { return originals[r] })
		}
	})
	describe := filepath.Join(t.TempDir(), "describe.json")
	runIn(t, dir, env, "bash", "-c", builds["1.0.0"]+" --describe > "+describe)
	if _, err := st.Ctrl(ctx, "kind", "register", "--describe", describe); err != nil {
		t.Fatal(err)
	}

	pin := func(region, version string) {
		t.Helper()
		block := fmt.Sprintf("\ncontroller \"quota\" {\n  path   = %q\n  sha256 = %q\n}\n", builds[version], pins[version])
		if err := st.EditKraneConfig(region, func(string) string { return originals[region] + block }); err != nil {
			t.Fatal(err)
		}
	}
	pin("local-a", "1.0.0")
	pin("local-b", "1.1.0")
	object := filepath.Join(t.TempDir(), "team-up.yaml")
	if err := os.WriteFile(object, []byte("kind: quota.acme.example\nid: team-up\nregions: [local-a, local-b]\nspec: {namespace: team-up, pods: 10}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// apply --wait refuses at once where no live cluster runs the kind:
	// the hosts first reload krane.hcl and say in a heartbeat that they
	// run the quota controller.
	for _, r := range regions {
		waitFor(t, 3*time.Minute, "cluster "+stack.ClusterID(r)+" reporting the quota controller running", func() error {
			names, err := clusterList(t, st).running(stack.ClusterID(r))
			if err != nil {
				return err
			}
			if !slices.Contains(names, "quota") {
				return fmt.Errorf("running: %v", names)
			}
			return nil
		})
	}
	if _, err := st.Ctrl(ctx, "resource", "apply", "-f", object, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	waitVersions := func(want map[string]string) {
		t.Helper()
		waitFor(t, 3*time.Minute, fmt.Sprintf("plugin versions %v in the statuses", want), func() error {
			got := reportedVersions(t, st)
			for r, v := range want {
				if got[r] != v {
					return fmt.Errorf("statuses report versions %v", got)
				}
			}
			return nil
		})
	}
	waitVersions(map[string]string{"local-a": "1.0.0", "local-b": "1.1.0"})

	// Upgrade local-a only.
	pidB := pluginPID(t, st, "local-b")
	pin("local-a", "1.1.0")
	waitVersions(map[string]string{"local-a": "1.1.0", "local-b": "1.1.0"})
	if now := pluginPID(t, st, "local-b"); now != pidB {
		t.Errorf("local-b's plugin process changed (%d, then %d): a reload of local-a must leave it alone", pidB, now)
	}
	if _, err := st.Ctrl(ctx, "resource", "delete", "quota.acme.example", "team-up", "--wait", "--timeout", "3m"); err != nil {
		t.Error(err)
	}
}

// reportedVersions reads, per region, the plugin version of the latest
// status of quota team-up, through `ctrl resource get -o json`.
func reportedVersions(t *testing.T, st *stack.Stack) map[string]string {
	t.Helper()
	out, err := st.Ctrl(context.Background(), "resource", "get", "quota.acme.example", "team-up", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Regions []struct {
			Region string
			Status struct {
				PluginVersion string `json:"plugin_version"`
			}
		}
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got := map[string]string{}
	for _, r := range info.Regions {
		got[r.Region] = r.Status.PluginVersion
	}
	return got
}

// pluginPID finds the quota plugin process a region's krane runs (its
// child whose command line names krane-plugin-quota).
func pluginPID(t *testing.T, st *stack.Stack, region string) int {
	t.Helper()
	parent := st.Krane(region).Pid()
	var found int
	waitFor(t, time.Minute, "the quota plugin process of "+region, func() error {
		for _, pid := range childProcesses(t, parent) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			if strings.Contains(string(cmdline), "krane-plugin-quota") {
				found = pid
				return nil
			}
		}
		return fmt.Errorf("no child of krane %d runs krane-plugin-quota", parent)
	})
	return found
}
