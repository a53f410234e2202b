package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

var forbidden = []string{"krane.dev/host", "krane.dev/ctrl", "krane.dev/internal", "krane.dev/plugins", "krane.dev/proto",
	"github.com/restatedev/", "github.com/go-sql-driver/mysql", "github.com/cilium/cilium"}

// TestSDKStaysLight keeps what a plugin author links small: the sdk's
// packages may not depend on the host, ctrl, the rest of this repository,
// Restate, MySQL or cilium.
func TestSDKStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "krane.dev/sdk", "krane.dev/sdk/kube", "krane.dev/sdk/plugintest", "krane.dev/sdk/envtest").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("sdk depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}

// TestSDKModuleStaysLight: a plugin author's go.mod requires only the sdk
// module, so what it downloads is the sdk module's own requirements.
func TestSDKModuleStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "krane.dev/sdk" {
			continue
		}
		mod := f[0]
		for _, bad := range forbidden {
			if strings.HasPrefix(mod, strings.TrimSuffix(bad, "/")) {
				t.Errorf("the sdk module requires %s (forbidden prefix %s)", mod, bad)
			}
		}
	}
}

// heavy are client-go packages a plugin built on the sdk must not link:
// the clientset and the informer factory register every built-in API
// group (and link their code), and client-go's test fakes pull the
// managed-fields machinery and the OpenAPI models in with them. sdk/kube
// builds what plugins need without them (typed.go).
var heavy = []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/testing", "k8s.io/client-go/gentype"}

// TestKubeLinksNoClientset: sdk/kube and the example plugin link none of
// heavy.
func TestKubeLinksNoClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "krane.dev/sdk/kube", "krane.dev/sdk/examples/configmap").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, h := range heavy {
			if dep == h || strings.HasPrefix(dep, h+"/") {
				t.Errorf("sdk/kube or the example plugin links %s", dep)
			}
		}
	}
}
