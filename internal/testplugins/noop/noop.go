// Package noop is a Krane plugin that applies nothing to any cluster: it
// remembers what it was told, answers Unchanged for a repeat, lists what it
// holds, and reports each object's version. Its kind comes from its binary
// name (krane-plugin-noop-X reconciles "noop-x.test.krane.dev"), so one
// build yields several distinct plugins for host tests and the plugin-hop
// benchmark.
package noop

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"krane.dev/sdk"
)

// Controller is the no-op controller; New(name) reconciles kind
// "<name>.test.krane.dev".
type Controller struct {
	name, kind string
	mu         sync.Mutex
	objects    map[string]sdk.Change
	dirty      chan string
}

// New returns a no-op controller named name.
func New(name string) *Controller {
	return &Controller{name: name, kind: name + ".test.krane.dev", objects: map[string]sdk.Change{}, dirty: make(chan string, 1024)}
}

// Kind is the kind this controller reconciles.
func (c *Controller) Kind() string { return c.kind }

// Get returns what the controller holds for id.
func (c *Controller) Get(id string) (sdk.Change, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.objects[id]
	return ch, ok
}

func (c *Controller) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name: c.name, Version: "1.0.0",
		Kinds:        []sdk.KindInfo{{Kind: c.kind, Description: "applies nothing (tests)", SpecType: "google.protobuf.Struct"}},
		ConfigSchema: `{"type":"object","additionalProperties":false,"properties":{"label":{"type":"string"},"environ_file":{"type":"string"}}}`,
		// It touches no cluster; it declares a read so conformance holds.
		Permissions: []sdk.Permission{{Resource: "namespaces", Verbs: []string{"get"}}},
	}}, nil
}

func (c *Controller) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct {
		Label string `json:"label"`
		// EnvironFile: the plugin writes its environment there, one
		// variable a line (tests of what the host passes a plugin).
		EnvironFile string `json:"environ_file"`
	}
	if err := sdk.DecodeConfig(req.Config, &cfg); err != nil {
		return nil, err
	}
	if cfg.EnvironFile != "" {
		if err := os.WriteFile(cfg.EnvironFile, []byte(strings.Join(os.Environ(), "\n")), 0o600); err != nil {
			return nil, fmt.Errorf("noop: write environ_file: %w", err)
		}
	}
	return nil, nil
}

func (c *Controller) Apply(_ context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := req.Change
	prev, had := c.objects[ch.ID]
	if ch.Deleted {
		delete(c.objects, ch.ID)
		c.mark(ch.ID)
		return sdk.Done(sdk.Deleted, nil)
	}
	if had && string(prev.Spec.Value) == string(ch.Spec.Value) && prev.Version == ch.Version {
		return sdk.Done(sdk.Unchanged, nil)
	}
	c.objects[ch.ID] = ch
	c.mark(ch.ID)
	return sdk.Done(sdk.Applied, nil)
}

func (c *Controller) mark(id string) {
	select {
	case c.dirty <- id:
	default:
	}
}

func (c *Controller) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &sdk.InventoryResponse{}
	for id, ch := range c.objects {
		out.Items = append(out.Items, sdk.InventoryItem{Kind: req.Kind, ID: id, Version: ch.Version})
	}
	return out, nil
}

func (c *Controller) WatchStatus(ctx context.Context, send func(sdk.StatusReport) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case id := <-c.dirty:
			c.mu.Lock()
			ch, ok := c.objects[id]
			c.mu.Unlock()
			st, _ := sdk.JSONStatus(map[string]any{"present": ok})
			if err := send(sdk.StatusReport{Kind: c.kind, ID: id, ObservedVersion: ch.Version, ObservedAt: time.Now(), Status: st}); err != nil {
				return err
			}
		}
	}
}

func (c *Controller) Shutdown(context.Context) error { return nil }
