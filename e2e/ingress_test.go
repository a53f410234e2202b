package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/workflows"
)

// post sends body to url and returns the status and the answer.
func post(t *testing.T, url string, body []byte, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestRestateIngressRefusesUnsignedCalls: whoever reaches Restate's
// ingress (or ctrl's endpoint) without ctrl's keys can start nothing. Every
// handler Restate knows of ctrl's, listed from its admin API, is refused by
// the ingress but CtrlIngress.Call, which refuses a call without ctrl's
// signature or with a forged one (a forged Notify{ready} would make a
// deployment live); ctrl's endpoint refuses requests Restate did not sign.
// The deploy, sentinel and rollout tests of this package go the same way
// and still work end to end; a deploy here shows it after the refusals.
func TestRestateIngressRefusesUnsignedCalls(t *testing.T) {
	st := sharedStack(t)
	ingress := st.Restate.IngressURL()
	resp, err := http.Get(st.Restate.AdminURL() + "/services")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Services []struct {
			Name     string `json:"name"`
			Ty       string `json:"ty"`
			Handlers []struct {
				Name string `json:"name"`
			} `json:"handlers"`
		} `json:"services"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, s := range list.Services {
		for _, h := range s.Handlers {
			if s.Name == workflows.GatewayName {
				continue
			}
			path := "/" + s.Name + "/e2e-key/" + h.Name
			if s.Ty == "Service" {
				path = "/" + s.Name + "/" + h.Name
			}
			code, body := post(t, ingress+path, []byte(`{}`), nil)
			if code != http.StatusBadRequest || !strings.Contains(body, "not public") {
				t.Errorf("POST %s through the ingress: %d %s; want 400, not public", path, code, body)
			}
			refused++
		}
	}
	if refused < 14 {
		t.Fatalf("only %d handlers listed by Restate's admin API: %+v", refused, list.Services)
	}

	// The gateway itself: a forged Notify{ready}, unsigned and signed with
	// a key that is not ctrl's.
	call, _ := json.Marshal(map[string]any{"service": workflows.DeployWorkflowName, "key": "dep_e2eforged", "handler": "Notify",
		"input": map[string]string{"result": "ready"}, "send": true, "at": time.Now().UnixMilli()})
	for name, header := range map[string]map[string]string{
		"unsigned": nil,
		"forged":   {workflows.SignatureHeader: "v1=" + strings.Repeat("00", 32)},
	} {
		code, body := post(t, ingress+"/"+workflows.GatewayName+"/Call", call, header)
		if code == http.StatusOK || !strings.Contains(body, "refused") {
			t.Errorf("%s call of %s.Call: %d %s; want it refused", name, workflows.GatewayName, code, body)
		}
	}

	// ctrl's endpoint answers only requests Restate signed.
	for _, path := range []string{"/discover", "/invoke/" + workflows.DeployWorkflowName + "/Notify"} {
		if code, body := post(t, st.CtrlEndpoint+path, []byte(`{}`), nil); code != http.StatusUnauthorized {
			t.Errorf("POST %s on ctrl's endpoint without Restate's signature: %d %s; want 401", path, code, body)
		}
	}

	id := deployJSON(t, st, "e2e-ingress", "registry.local/e2e/ingress:1", 1)
	out, err := st.Ctrl(context.Background(), "deploy", "get", id)
	if err != nil || !strings.Contains(string(out), "ready") {
		t.Fatalf("deploy get %s after the refused calls: %v\n%s", id, err, out)
	}
	t.Logf("%d handlers refused by the ingress; %s.Call refused unsigned and forged calls; the endpoint refused unsigned requests; %s deployed",
		refused, workflows.GatewayName, fmt.Sprint(id))
}
