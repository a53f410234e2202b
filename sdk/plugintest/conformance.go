package plugintest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"krane.dev/sdk"
)

// Suite describes what the conformance suite exercises for one plugin.
type Suite struct {
	// Configure is a valid configuration for the test cluster.
	Configure sdk.ConfigureRequest
	// BadConfigs must each be rejected, by the config schema or by
	// Configure, with an error that names Key.
	BadConfigs []BadConfig
	// Objects are valid desired states (at least one per kind). Each is
	// applied, re-applied (must be Unchanged, with no API write: the suite
	// counts the plugin's calls through a proxy in front of the API server
	// of Configure.Kube), inventoried and deleted.
	Objects []sdk.Change
	// Invalid desired states must each fail with a permanent error that
	// names the field, before anything reaches the cluster.
	Invalid []InvalidChange
	// ShutdownDeadline bounds Shutdown; default 5s.
	ShutdownDeadline time.Duration
}

// BadConfig is a config block that must be rejected.
type BadConfig struct {
	Config string
	Key    string
}

// InvalidChange is a desired state that must be refused.
type InvalidChange struct {
	Change sdk.Change
	Field  string
}

var (
	nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	kindRE = regexp.MustCompile(`^[a-z][a-z0-9]*(\.[a-z0-9-]+)*$`)
)

// Conformance runs the suite every Krane plugin must pass. ctl should come
// from New, so the calls cross the real gRPC boundary. Shutdown runs last.
// The plugin reaches the cluster through a counting proxy (the suite
// rewrites s.Configure.Kube), so a write on an unchanged Apply fails.
func Conformance(t *testing.T, ctl sdk.Plugin, s Suite) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var writes *writeCounter
	s.Configure.Kube, writes = countWrites(t, s.Configure.Kube)
	var info sdk.Info

	t.Run("Describe", func(t *testing.T) {
		resp, err := ctl.Describe(ctx, &sdk.DescribeRequest{})
		if err != nil {
			t.Fatal(err)
		}
		info = resp.Info
		if !nameRE.MatchString(info.Name) {
			t.Errorf("name %q: want lowercase letters, digits and dashes", info.Name)
		}
		if info.Version == "" {
			t.Error("version is empty")
		}
		if len(info.Kinds) == 0 {
			t.Error("no kinds")
		}
		seen := map[string]bool{}
		for _, k := range info.Kinds {
			if !kindRE.MatchString(k.Kind) || seen[k.Kind] {
				t.Errorf("kind %q: invalid or duplicate", k.Kind)
			}
			seen[k.Kind] = true
			if k.SpecType == "" {
				t.Errorf("kind %q has no spec type", k.Kind)
			}
		}
		if _, err := sdk.CompileConfigSchema(info.ConfigSchema); err != nil {
			t.Errorf("config schema: %v", err)
		}
		if len(info.Permissions) == 0 {
			t.Error("no permissions: declare what the plugin's identity must be allowed to do (Info.Permissions)")
		}
		for _, p := range info.Permissions {
			if p.Resource == "" || len(p.Verbs) == 0 {
				t.Errorf("permission %+v: a resource and at least one verb are required", p)
			}
		}
	})

	t.Run("SpecSchemaAcceptsObjects", func(t *testing.T) {
		for _, k := range info.Kinds {
			if k.SpecSchema == "" {
				continue
			}
			for _, ch := range s.Objects {
				if ch.Kind != k.Kind {
					continue
				}
				if err := sdk.ValidateSpec(k.SpecSchema, ch.Spec); err != nil {
					t.Errorf("%s %s: a valid object fails the kind's published spec schema: %v", ch.Kind, ch.ID, err)
				}
			}
		}
	})

	t.Run("ConfigSchemaRoundTrip", func(t *testing.T) {
		if err := sdk.ValidateConfig(info.ConfigSchema, s.Configure.Config); err != nil {
			t.Errorf("the suite's valid config fails the plugin's own schema: %v", err)
		}
	})

	t.Run("BadConfigRejected", func(t *testing.T) {
		for _, bad := range s.BadConfigs {
			schemaErr := sdk.ValidateConfig(info.ConfigSchema, json.RawMessage(bad.Config))
			req := s.Configure
			req.Config = json.RawMessage(bad.Config)
			_, cfgErr := ctl.Configure(ctx, &req)
			var ce *sdk.ConfigError
			if !errors.As(cfgErr, &ce) {
				t.Errorf("Configure(%s) = %v, want a ConfigError", bad.Config, cfgErr)
				continue
			}
			if !strings.Contains(ce.Error(), bad.Key) && (schemaErr == nil || !strings.Contains(schemaErr.Error(), bad.Key)) {
				t.Errorf("config %s rejected without naming key %q: schema: %v; Configure: %v", bad.Config, bad.Key, schemaErr, cfgErr)
			}
		}
	})

	t.Run("Configure", func(t *testing.T) {
		if _, err := ctl.Configure(ctx, &s.Configure); err != nil {
			t.Fatalf("valid config rejected: %v", err)
		}
	})

	t.Run("InvalidIsPermanent", func(t *testing.T) {
		for _, inv := range s.Invalid {
			_, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: inv.Change})
			var pe *sdk.PermanentError
			if !errors.As(err, &pe) {
				t.Errorf("Apply(%s %s) = %v, want a permanent error", inv.Change.Kind, inv.Change.ID, err)
				continue
			}
			if inv.Field != "" && pe.Field != inv.Field && !strings.Contains(pe.Error(), inv.Field) {
				t.Errorf("Apply(%s %s) error %q does not name field %q", inv.Change.Kind, inv.Change.ID, pe.Error(), inv.Field)
			}
		}
	})

	t.Run("ApplyIsIdempotent", func(t *testing.T) {
		for _, ch := range s.Objects {
			resp, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: ch})
			if err != nil {
				t.Fatalf("Apply(%s %s): %v", ch.Kind, ch.ID, err)
			}
			if first := resp.GetResult(); first != sdk.Applied && first != sdk.Unchanged {
				t.Errorf("Apply(%s %s) = %s, want applied", ch.Kind, ch.ID, first)
			}
			second := eventually(ctx, func() sdk.Result {
				r, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: ch})
				if err != nil {
					t.Fatalf("re-Apply(%s %s): %v", ch.Kind, ch.ID, err)
				}
				return r.GetResult()
			}, sdk.Unchanged)
			if second != sdk.Unchanged {
				t.Errorf("re-Apply(%s %s) = %s, want unchanged", ch.Kind, ch.ID, second)
				continue
			}
			// The result alone does not prove it: a plugin can write and
			// still answer Unchanged. Once the plugin has seen its own
			// write, a further Apply must make no API write at all.
			n := writes.count()
			third, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: ch})
			if err != nil {
				t.Fatalf("re-Apply(%s %s): %v", ch.Kind, ch.ID, err)
			}
			if third.GetResult() != sdk.Unchanged {
				t.Errorf("re-Apply(%s %s) = %s after an unchanged one, want unchanged", ch.Kind, ch.ID, third.GetResult())
			}
			writes.noWrites(t, n, fmt.Sprintf("re-Apply(%s %s)", ch.Kind, ch.ID))
		}
	})

	t.Run("InventoryListsApplied", func(t *testing.T) {
		for _, ch := range s.Objects {
			found := false
			deadline := time.Now().Add(waitBound)
			for !found && time.Now().Before(deadline) {
				resp, err := ctl.Inventory(ctx, &sdk.InventoryRequest{Kind: ch.Kind})
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range resp.Items {
					if it.ID == ch.ID && it.Version == ch.Version {
						found = true
					}
				}
				if !found {
					time.Sleep(100 * time.Millisecond)
				}
			}
			if !found {
				t.Errorf("Inventory(%s) does not list %s at version %d", ch.Kind, ch.ID, ch.Version)
			}
		}
	})

	t.Run("DeleteIsIdempotent", func(t *testing.T) {
		for _, ch := range s.Objects {
			del := sdk.Change{Kind: ch.Kind, ID: ch.ID, Version: ch.Version + 1, Deleted: true}
			for i := range 2 {
				r, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: del})
				if err != nil || r.GetResult() != sdk.Deleted {
					t.Errorf("delete #%d of %s %s = %s, %v; want deleted", i+1, ch.Kind, ch.ID, r.GetResult(), err)
				}
			}
			deadline := time.Now().Add(waitBound)
			for {
				resp, err := ctl.Inventory(ctx, &sdk.InventoryRequest{Kind: ch.Kind})
				if err != nil {
					t.Fatal(err)
				}
				if !listed(resp.Items, ch.ID) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("Inventory(%s) still lists deleted %s", ch.Kind, ch.ID)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	})

	t.Run("ShutdownWithinDeadline", func(t *testing.T) {
		d := s.ShutdownDeadline
		if d == 0 {
			d = 5 * time.Second
		}
		sctx, scancel := context.WithTimeout(context.Background(), d)
		defer scancel()
		start := time.Now()
		if err := ctl.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if took := time.Since(start); took > d {
			t.Errorf("Shutdown took %s, deadline %s", took, d)
		}
	})
}

// waitBound bounds how long the suite waits for a plugin's informer to
// observe its own write: generous, for a loaded machine; a plugin that is
// quick passes quickly.
const waitBound = 30 * time.Second

// eventually retries f until it returns want: a plugin's informer may need
// a moment to observe its own write.
func eventually(ctx context.Context, f func() sdk.Result, want sdk.Result) sdk.Result {
	deadline := time.Now().Add(waitBound)
	for {
		r := f()
		if r == want || time.Now().After(deadline) || ctx.Err() != nil {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func listed(items []sdk.InventoryItem, id string) bool {
	for _, it := range items {
		if it.ID == id {
			return true
		}
	}
	return false
}
