package restateingress

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/restatedev/sdk-go/ingress"

	"krane.dev/internal/testenv"
)

// TestAttachToAnUndeliveredInvocationSaysRetry: Restate answers an attach
// to an invocation its partition does not know yet with 404 "not found"
// marked as the invocation's outcome, which the operators' APIs answered
// NOT_FOUND: GetRolloutStatus failed that way once right after Restate
// restarted (TestRolloutSurvivesRestateKillAndCtrlRestart), when the Status
// invocation CtrlIngress.Call had started took longer than
// attachNotFoundFor to reach its recovering partition. An invocation ctrl
// started exists; past the bound the answer must say retry (no ingress
// error in its chain, so UNAVAILABLE).
func TestAttachToAnUndeliveredInvocationSaysRetry(t *testing.T) {
	rs := testenv.SharedRestate(t)
	c := NewIngressClient(rs.IngressURL(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), attachNotFoundFor+30*time.Second)
	defer cancel()
	// A well-formed id no partition holds: what an attach sees before the
	// invocation is delivered.
	_, err := c.attach(ctx, "inv_1gdJBtdVEcM942bjcDmb1c1khoaJe11Hbz")
	if err == nil {
		t.Fatal("attach to an unknown invocation succeeded")
	}
	var ie ingress.Error
	if errors.As(err, &ie) {
		t.Fatalf("attach past its bound returned the ingress's error (code %d, invocation outcome %v), which the APIs answer as the call's own: %v",
			ie.Code(), ie.IsInvocationError(), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("attach did not end within its bound: %v", err)
	}
}
