package workflows_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestSignedCallsCannotBeReplayed: a signed call of CtrlIngress.Call, seen
// on the wire and sent again within its signature's window, is refused:
// its nonce was used. A call without a nonce is refused too. (Calls with
// an idempotency key were safe already; these are the ones without one,
// such as a rollout's Cancel.)
func TestSignedCallsCannotBeReplayed(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	ctx := context.Background()
	key, err := env.Store.CtrlKey(ctx, store.RestateIngressKey)
	if err != nil {
		t.Fatal(err)
	}
	send := func(body []byte) (int, string) {
		m := hmac.New(sha256.New, key)
		m.Write(body)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.Restate.IngressURL()+"/"+workflows.GatewayName+"/Call", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(workflows.SignatureHeader, "v1="+hex.EncodeToString(m.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	call := func(nonce string) []byte {
		b, err := json.Marshal(map[string]any{"service": workflows.RolloutServiceName, "key": "replay-test", "handler": "Status",
			"at": time.Now().UnixMilli(), "nonce": nonce})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := call("0123456789abcdef0123456789abcdef")
	if code, body := send(first); code != http.StatusOK {
		t.Fatalf("a signed call: %d %s", code, body)
	}
	if code, body := send(first); code == http.StatusOK || !strings.Contains(body, "replay") {
		t.Fatalf("the same signed call again: %d %s; want it refused as a replay", code, body)
	}
	if code, body := send(call("")); code == http.StatusOK || !strings.Contains(body, "nonce") {
		t.Fatalf("a signed call without a nonce: %d %s; want it refused", code, body)
	}
	// ctrl's own calls carry fresh nonces and go through.
	if _, err := env.Rollouts(t).GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); err != nil {
		t.Fatalf("ctrl's own call after the refusals: %v", err)
	}
}
