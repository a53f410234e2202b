package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/internal/testenv"
)

// TestCtrlLineIsTheReleaseBeingBuilt: the manifests name ctrl's
// Deployment and Restate Service for the line this tree builds
// (scripts/version.sh), and label the line's pods and select only them
// for Restate, so the next line's manifests install beside this one's
// rather than rolling over it (docs/operating.md, "Upgrading").
func TestCtrlLineIsTheReleaseBeingBuilt(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimPrefix(restateendpoint.Base(testenv.BuildVersion()), "/")
	if line == "" {
		t.Fatalf("this tree's version %q is not a release version: run in a git checkout", testenv.BuildVersion())
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "base", "ctrl", "line", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		NameSuffix string `json:"nameSuffix"`
		Labels     []struct {
			Pairs            map[string]string `json:"pairs"`
			IncludeSelectors bool              `json:"includeSelectors"`
		} `json:"labels"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if want := "-" + strings.ReplaceAll(line, ".", "-"); k.NameSuffix != want {
		t.Errorf("deploy/base/ctrl/line names its objects with suffix %q; this tree builds line %s: want %q", k.NameSuffix, line, want)
	}
	if len(k.Labels) != 1 || k.Labels[0].Pairs["krane.dev/ctrl-line"] != line || !k.Labels[0].IncludeSelectors {
		t.Errorf("deploy/base/ctrl/line labels %+v; want krane.dev/ctrl-line: %s, in the selectors too", k.Labels, line)
	}
}
