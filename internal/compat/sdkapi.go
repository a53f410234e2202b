package compat

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/tools/go/packages"
)

// SDKModule is the module plugin authors require.
const SDKModule = "krane.dev/sdk"

// LoadSDK type-checks the public packages of the sdk module in dir (a
// tree's sdk/): every package but internal ones and commands.
func LoadSDK(dir string) (*apidiff.Module, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedImports | packages.NeedDeps,
		Dir:  dir,
		Env:  append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly"),
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, fmt.Errorf("load the sdk in %s: %w", dir, err)
	}
	m := &apidiff.Module{Path: SDKModule}
	var errs []string
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
		if p.Name == "main" || strings.Contains(p.PkgPath+"/", "/internal/") || p.Types == nil {
			continue
		}
		m.Packages = append(m.Packages, p.Types)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("load the sdk in %s: %s", dir, strings.Join(errs, "; "))
	}
	return m, nil
}

// SDKChanges are the changes of the sdk's exported API from old to new:
// incompatible ones break a plugin author's code built on old.
func SDKChanges(old, new *apidiff.Module) (incompatible, compatible []string) {
	for _, c := range apidiff.ModuleChanges(old, new).Changes {
		if c.Compatible {
			compatible = append(compatible, c.Message)
		} else {
			incompatible = append(incompatible, c.Message)
		}
	}
	return incompatible, compatible
}
