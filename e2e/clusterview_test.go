package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"krane.dev/internal/stack"
)

// fleetDoc is what `ctrl admin cluster list -o json` prints, as far as these
// tests read it.
type fleetDoc struct {
	Clusters []struct {
		ID                  string `json:"id"`
		Region              string `json:"region"`
		LastHeartbeatAt     string `json:"lastHeartbeatAt"`
		ControllersReported bool   `json:"controllersReported"`
		Controllers         []struct {
			Name          string   `json:"name"`
			PluginVersion string   `json:"pluginVersion"`
			Kinds         []string `json:"kinds"`
			Running       bool     `json:"running"`
		} `json:"controllers"`
		Kinds []struct {
			Kind        string   `json:"kind"`
			Cursor      *string  `json:"cursor"`
			LagVersions *string  `json:"lagVersions"`
			LagSeconds  *float64 `json:"lagSeconds"`
			Parked      *int     `json:"parked"`
		} `json:"kinds"`
	} `json:"clusters"`
}

func clusterList(t *testing.T, st *stack.Stack) fleetDoc {
	t.Helper()
	code, out, errOut := ctrlRun(t, st, "", "admin", "cluster", "list", "-o", "json")
	var doc fleetDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("ctrl admin cluster list -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	return doc
}

// running returns the names of a cluster's running controllers that own
// kinds, sorted, or an error when it reports none.
func (d fleetDoc) running(cluster string) ([]string, error) {
	for _, c := range d.Clusters {
		if c.ID != cluster {
			continue
		}
		if !c.ControllersReported {
			return nil, fmt.Errorf("cluster %s reports no controllers", cluster)
		}
		var names []string
		for _, ctl := range c.Controllers {
			if ctl.Running && len(ctl.Kinds) > 0 && ctl.PluginVersion != "" {
				names = append(names, ctl.Name)
			}
		}
		slices.Sort(names)
		return names, nil
	}
	return nil, fmt.Errorf("no cluster %s listed", cluster)
}

// TestClusterListAndFailFastDeploy: `ctrl admin cluster list` shows both demo
// clusters with their controllers (versions, kinds, running) and, per
// built-in kind, the cursor and lag in versions and time. With the
// deployment controller disabled in local-b's krane.hcl, a deploy to
// local-b fails at once with a message naming the region and what runs
// there, instead of waiting out its timeout.
func TestClusterListAndFailFastDeploy(t *testing.T) {
	st := sharedStack(t)
	all := []string{"cilium", "deployment", "sentinel"}
	waitFor(t, 2*time.Minute, "both clusters reporting the built-in controllers and their lag", func() error {
		doc := clusterList(t, st)
		for _, id := range []string{"local-a-1", "local-b-1"} {
			names, err := doc.running(id)
			if err != nil {
				return err
			}
			if !slices.Equal(names, all) {
				return fmt.Errorf("cluster %s runs %v, want %v", id, names, all)
			}
		}
		for _, c := range doc.Clusters {
			seen := map[string]bool{}
			for _, k := range c.Kinds {
				if k.Cursor != nil && k.LagVersions != nil && k.Parked != nil {
					seen[k.Kind] = true
				}
			}
			if !seen["deployment"] || !seen["sentinel"] || !seen["ciliumnetworkpolicy"] {
				return fmt.Errorf("cluster %s: kinds %+v, want cursor, lag and parked of each built-in kind", c.ID, c.Kinds)
			}
		}
		return nil
	})
	code, out, errOut := ctrlRun(t, st, "", "admin", "cluster", "list")
	if code != 0 || !strings.Contains(out, "LAG AGE") || !strings.Contains(out, "local-a-1") || !strings.Contains(out, "local-b-1") ||
		!strings.Contains(out, "deployment") {
		t.Fatalf("ctrl admin cluster list: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("ctrl admin cluster list:\n%s", out)

	// Disable the deployment controller in local-b.
	const region = "local-b"
	hcl, err := st.KraneConfigPath(region)
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(hcl)
	if err != nil {
		t.Fatal(err)
	}
	on := "controller \"deployment\" {\n  enabled = true"
	if !strings.Contains(string(before), on) {
		t.Fatalf("%s has no %q to turn off:\n%s", hcl, on, before)
	}
	t.Cleanup(func() {
		// The shared stack's other tests deploy to local-b.
		if err := st.EditKraneConfig(region, func(string) string { return string(before) }); err != nil {
			t.Errorf("restore %s: %v", hcl, err)
			return
		}
		waitFor(t, 2*time.Minute, "local-b running its deployment controller again", func() error {
			names, err := clusterList(t, st).running("local-b-1")
			if err == nil && !slices.Equal(names, all) {
				err = fmt.Errorf("runs %v", names)
			}
			return err
		})
	})
	if err := st.EditKraneConfig(region, func(s string) string {
		return strings.Replace(s, on, "controller \"deployment\" {\n  enabled = false", 1)
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "ctrl to learn that local-b runs no deployment controller", func() error {
		names, err := clusterList(t, st).running("local-b-1")
		if err == nil && slices.Contains(names, "deployment") {
			err = fmt.Errorf("runs %v", names)
		}
		return err
	})

	begin := time.Now()
	code, out, errOut = ctrlRun(t, st, "", "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a",
		"--environment", "e2e-failfast", "--image", "registry.local/e2e/failfast:1", "--region", region, "--wait")
	took := time.Since(begin)
	want := `region "local-b": no live cluster runs a controller for kind "deployment" (cluster local-b-1 runs: cilium, sentinel)`
	if code == 0 || !strings.Contains(errOut, want) {
		t.Fatalf("deploy to local-b without its deployment controller: exit %d after %s\nstdout:\n%s\nstderr:\n%s\nwant %q",
			code, took.Round(time.Millisecond), out, errOut, want)
	}
	// At once, not after deploy.timeout (5 minutes).
	if took > time.Minute {
		t.Fatalf("the refusal took %s", took)
	}
	t.Logf("refused in %s: %s", took.Round(time.Millisecond), strings.TrimSpace(errOut))
}
