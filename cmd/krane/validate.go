package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/host/identity"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/version"
)

// validateConfig checks krane.hcl and, for each enabled controller, starts
// its plugin only to ask for its schema (sha256 pin included), then checks
// the config block against it. Nothing connects to ctrl. With cluster set,
// it also asks the API server (SelfSubjectAccessReview, as the plugin's
// own ServiceAccount, whose token the host requests as it does at run time;
// as the identity of krane.hcl's kubernetes block when plugin identities
// are off) whether each plugin may do what it declares it needs, naming
// every missing permission.
func validateConfig(ctx context.Context, path string, cluster bool) error {
	cfg, err := config.Load(path, nil)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(cfg.Controllers))
	for n := range cfg.Controllers {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		ctl := cfg.Controllers[n]
		if !ctl.Enabled {
			fmt.Printf("controller %-12s disabled\n", n)
			continue
		}
		info, err := describe(ctx, ctl, cfg.Log.Level)
		if err == nil {
			var js []byte
			if js, err = ctl.ConfigJSON(info.ConfigSchema); err == nil {
				err = sdk.ValidateConfig(info.ConfigSchema, js)
			}
		}
		if err == nil && cluster {
			err = checkRBAC(ctx, cfg, ctl, info)
		}
		if err != nil {
			fmt.Printf("controller %-12s INVALID: %v\n", n, err)
			errs = append(errs, fmt.Errorf("controller %q: %w", n, err))
			continue
		}
		rbac := ""
		if cluster {
			who := "krane's identity"
			if cfg.Kubernetes.PluginIdentities.Enabled {
				who = cfg.Kubernetes.PluginIdentities.Namespace + "/" + ctl.ServiceAccount
			}
			rbac = fmt.Sprintf(", RBAC ok as %s: %d permissions", who, len(info.Permissions))
		}
		fmt.Printf("controller %-12s ok (%s %s, kinds %v%s)\n", n, info.Name, info.Version, kinds(info), rbac)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	fmt.Printf("%s: ok\n", path)
	fmt.Printf("note: a reload (SIGHUP, or the file changing) applies everything but %s: those take effect when krane starts\n", strings.Join(agent.RestartOnly, ", "))
	return nil
}

func describe(ctx context.Context, ctl config.Controller, level string) (sdk.Info, error) {
	if _, err := os.Stat(ctl.Path); err != nil {
		return sdk.Info{}, fmt.Errorf("plugin binary: %w", err)
	}
	var sum []byte
	if len(ctl.SHA256) > 0 {
		digest, err := config.FileSHA256(ctl.Path)
		if err != nil {
			return sdk.Info{}, fmt.Errorf("plugin binary: %w", err)
		}
		if err := ctl.PinError(digest, version.Version); err != nil {
			return sdk.Info{}, err
		}
		if sum, err = hex.DecodeString(digest); err != nil {
			return sdk.Info{}, err
		}
	}
	cc, err := sdk.NewClientConfig(sdk.ClientOptions{Path: ctl.Path, SHA256: sum, Logger: hclog.NewNullLogger(), LogLevel: level})
	if err != nil {
		return sdk.Info{}, err
	}
	client := plugin.NewClient(cc)
	defer client.Kill()
	c, err := sdk.Dispense(client)
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return sdk.Info{}, fmt.Errorf("%s changed while it was starting and no longer matches its pinned sha256", ctl.Path)
		}
		return sdk.Info{}, err
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	resp, err := c.Describe(dctx, &sdk.DescribeRequest{})
	if err != nil {
		return sdk.Info{}, err
	}
	return resp.Info, nil
}

// checkRBAC runs the check a plugin's Configure runs (kube.Connect), as
// the identity krane.hcl gives the plugin: its own ServiceAccount (which
// also proves the host may request its tokens), or the host's.
func checkRBAC(ctx context.Context, cfg *config.Config, ctl config.Controller, info sdk.Info) error {
	src := sdk.KubeSource{InCluster: cfg.Kubernetes.Kubeconfig == "", Path: cfg.Kubernetes.Kubeconfig, Context: cfg.Kubernetes.Context}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if cfg.Kubernetes.PluginIdentities.Enabled {
		m, err := identity.NewMinter(cfg.Kubernetes)
		if err != nil {
			return fmt.Errorf("identity: %w", err)
		}
		own, remove, err := m.Issue(cctx, ctl.ServiceAccount)
		if err != nil {
			return fmt.Errorf("identity: %w", err)
		}
		defer remove()
		src = own
	}
	if _, err := kube.Connect(cctx, src, info.Permissions); err != nil {
		return fmt.Errorf("RBAC: %w", err)
	}
	return nil
}

func kinds(info sdk.Info) []string {
	var out []string
	for _, k := range info.Kinds {
		out = append(out, k.Kind)
	}
	return out
}
