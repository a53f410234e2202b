package bench

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPluginsLinkNoClientset keeps the built-in plugins within their size
// targets (the binaries section measures them): none links client-go's
// clientset or informer factory (which register every built-in API group
// and link their code), client-go's test fakes, or cilium's clientsets
// (its validator and CRD client packages link them).
func TestPluginsLinkNoClientset(t *testing.T) {
	heavy := []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/testing", "k8s.io/client-go/gentype",
		"github.com/cilium/cilium/pkg/k8s/client", "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/client"}
	for _, plugin := range []string{"krane.dev/plugins/deployment", "krane.dev/plugins/sentinel", "krane.dev/plugins/cilium"} {
		out, err := exec.Command("go", "list", "-deps", plugin).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", plugin, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, h := range heavy {
				if dep == h || strings.HasPrefix(dep, h+"/") {
					t.Errorf("%s links %s", plugin, dep)
				}
			}
		}
	}
}
