package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/rest"

	"krane.dev/sdk"
	"krane.dev/sdk/envtest"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
)

// TestConformanceFailsAWriteOnUnchanged runs the conformance suite, in a
// child process, on this plugin broken the way a plugin most often is: it
// answers Unchanged but writes its object on every Apply anyway (a no-op
// PATCH). The result value alone cannot tell; the suite counts the API
// writes, so the child must fail and name the write.
func TestConformanceFailsAWriteOnUnchanged(t *testing.T) {
	if os.Getenv("KRANE_CONFORMANCE_BROKEN") == "1" {
		conformanceOfBrokenPlugin(t)
		return
	}
	if testing.Short() {
		t.Skip("starts a cluster in a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceFailsAWriteOnUnchanged$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KRANE_CONFORMANCE_BROKEN=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		t.Fatalf("the suite passed a plugin that writes on every unchanged Apply:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "answered unchanged but made") || !strings.Contains(out.String(), "PATCH /api/v1/namespaces/team-a/configmaps/settings") {
		t.Fatalf("the suite failed the broken plugin, but not for its write (%v):\n%s", err, out.String())
	}
}

func conformanceOfBrokenPlugin(t *testing.T) {
	cluster := envtest.Shared(t)
	if err := cluster.EnsureNamespace(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	ctl := plugintest.New(t, &writesOnUnchanged{Controller: NewController(hclog.NewNullLogger())})
	plugintest.Conformance(t, ctl, plugintest.Suite{
		Configure: sdk.ConfigureRequest{Kube: sdk.KubeSource{Path: cluster.Kubeconfig}, Config: []byte(`{}`)},
		Objects:   []sdk.Change{change(t, "r1", 10, Spec{Namespace: "team-a", Name: "settings", Data: map[string]string{"mode": "fast"}})},
	})
}

// writesOnUnchanged is the configmap plugin with the bug: after an
// Unchanged Apply it PATCHes the ConfigMap with an empty merge patch.
type writesOnUnchanged struct {
	sdk.Controller
	cfg    *rest.Config
	client *http.Client
}

func (w *writesOnUnchanged) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	cfg, err := kube.RESTConfig(req.Kube)
	if err != nil {
		return nil, err
	}
	if w.client, err = rest.HTTPClientFor(cfg); err != nil {
		return nil, err
	}
	w.cfg = cfg
	return w.Controller.Configure(ctx, req)
}

func (w *writesOnUnchanged) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	resp, err := w.Controller.Apply(ctx, req)
	if err != nil || resp.Result != sdk.Unchanged {
		return resp, err
	}
	var s Spec
	if err := req.Spec.DecodeJSON(&s); err != nil {
		return nil, err
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps/%s", strings.TrimSuffix(w.cfg.Host, "/"), s.Namespace, s.Name)
	patch, err := http.NewRequestWithContext(ctx, http.MethodPatch, url, strings.NewReader(`{}`))
	if err != nil {
		return nil, err
	}
	patch.Header.Set("Content-Type", "application/merge-patch+json")
	r, err := w.client.Do(patch)
	if err != nil {
		return nil, err
	}
	r.Body.Close()
	return resp, nil
}

func (w *writesOnUnchanged) WatchStatus(ctx context.Context, send func(sdk.StatusReport) error) error {
	if sw, ok := w.Controller.(sdk.StatusWatcher); ok {
		return sw.WatchStatus(ctx, send)
	}
	<-ctx.Done()
	return nil
}

func (w *writesOnUnchanged) Shutdown(ctx context.Context) error {
	if sd, ok := w.Controller.(sdk.Shutdowner); ok {
		return sd.Shutdown(ctx)
	}
	return nil
}
