package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/sdk"
)

// TestHostLooksUpDesiredState: a plugin's Host answers GetDesiredState from
// ctrl for the kinds its controller reconciles, says NotFound for an
// object ctrl does not hold, and refuses another controller's kinds.
func TestHostLooksUpDesiredState(t *testing.T) {
	h := newHarness(t, configmapController)
	version := h.ctrl.PutJSON(cmKind, "obj-1", h.cm(1, "1"))
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually(t, 30*time.Second, "the configmap controller owns its kind", func() error {
		if _, err := h.agent.HostFor("configmap").(sdk.DesiredStates).GetDesiredState(ctx, cmKind, "obj-1"); err != nil {
			return err
		}
		return nil
	})
	ch, err := h.agent.HostFor("configmap").(sdk.DesiredStates).GetDesiredState(ctx, cmKind, "obj-1")
	if err != nil {
		t.Fatal(err)
	}
	if ch.Kind != cmKind || ch.ID != "obj-1" || ch.Version != version || ch.Deleted || ch.Spec.TypeURL == "" {
		t.Errorf("desired state %+v, want %s obj-1 at version %d with a spec", ch, cmKind, version)
	}
	if _, err := h.agent.HostFor("configmap").(sdk.DesiredStates).GetDesiredState(ctx, cmKind, "nope"); status.Code(err) != codes.NotFound {
		t.Errorf("an object ctrl does not hold: %v, want NotFound", err)
	}
	if _, err := h.agent.HostFor("other").(sdk.DesiredStates).GetDesiredState(ctx, cmKind, "obj-1"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another controller's kind: %v, want PermissionDenied", err)
	}
	if v := h.metric(fmt.Sprintf(`krane_host_desired_state_lookups_total{code="OK",controller=%q}`, "configmap")); v < 1 {
		t.Errorf("look-ups counted %v, want >= 1", v)
	}
}
