package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// BuiltIn names the controllers whose plugins the krane image ships
// (/usr/local/lib/krane/plugins): a release lists their digests in its
// plugins.hcl, in the form a pin takes.
var BuiltIn = []string{"deployment", "sentinel", "cilium"}

// FileSHA256 is the hex sha256 of a file's content, the form a pin takes.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// PinError says why a plugin binary of the given digest may not run under
// the controller's pin (nil when it is unpinned or the pin lists the
// digest). The error names the binary's digest and what to do; for a
// built-in plugin, hostVersion is the krane release whose plugins.hcl
// lists the digests its image ships.
func (c Controller) PinError(digest, hostVersion string) error {
	if len(c.SHA256) == 0 || slices.Contains(c.SHA256, digest) {
		return nil
	}
	pins := `"` + strings.Join(c.SHA256, `", "`) + `"`
	if len(c.SHA256) > 1 {
		pins = "[" + pins + "]"
	}
	msg := fmt.Sprintf("controller %q: plugin binary %s has sha256 %s, which its pin does not list (sha256 = %s): refusing to run it", c.Name, c.Path, digest, pins)
	if slices.Contains(BuiltIn, c.Name) {
		msg += fmt.Sprintf(". If this is the plugin krane %s ships (its release's plugins.hcl and SHA256SUMS list it), pin it: sha256 = %q; to move pins before an image upgrade, list both releases' digests for the roll (docs/operating.md, Upgrading)", hostVersion, digest)
	} else {
		msg += fmt.Sprintf(". If the binary was upgraded on purpose, update sha256 in krane.hcl to %q (or list the old and new digests while the upgrade rolls)", digest)
	}
	return fmt.Errorf("%s", msg)
}
