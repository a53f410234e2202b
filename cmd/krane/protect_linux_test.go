//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestPluginsCannotReadKranesEnvironment: a child of krane running as
// krane's user (what a plugin is) tries to read krane's
// /proc/<pid>/environ, which holds the ctrl token. After protectEnviron it
// is refused; without it (the negative control) it reads the token. The
// processes run as an unprivileged user (65532, krane's in its image) when
// the test runs as root, whose capabilities would read anything.
func TestPluginsCannotReadKranesEnvironment(t *testing.T) {
	// The test binary, where an unprivileged user may run it.
	dir := t.TempDir()
	bin := filepath.Join(dir, "krane.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, protect := range []bool{true, false} {
		cmd := exec.Command(bin, "-test.run=^TestHelperKraneProcess$")
		cmd.Env = append(os.Environ(), "KRANE_TEST_ROLE=host", "KRANE_TOKEN=secret-token-of-the-test", fmt.Sprintf("KRANE_TEST_PROTECT=%v", protect))
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("protect=%v: %v\n%s", protect, err, out.String())
		}
		read := strings.Contains(out.String(), "plugin read the token")
		if protect && read {
			t.Errorf("a plugin read krane's token after protectEnviron:\n%s", out.String())
		}
		if !protect && !read {
			t.Errorf("negative control: without protectEnviron the plugin should read the token (else this test proves nothing):\n%s", out.String())
		}
	}
}

// TestHelperKraneProcess plays krane (which starts a plugin) and the plugin
// for TestPluginsCannotReadKranesEnvironment; run alone it does nothing.
func TestHelperKraneProcess(t *testing.T) {
	switch os.Getenv("KRANE_TEST_ROLE") {
	case "host":
		if os.Getenv("KRANE_TEST_PROTECT") == "true" {
			if err := protectEnviron(); err != nil {
				t.Fatal(err)
			}
		}
		// As the host starts plugins: its own binary path, the plugin's
		// environment without the token (pluginEnviron's rule).
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKraneProcess$")
		cmd.Env = []string{"KRANE_TEST_ROLE=plugin"}
		out, err := cmd.CombinedOutput()
		fmt.Print(string(out))
		if err != nil {
			t.Fatal(err)
		}
	case "plugin":
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", os.Getppid()))
		switch {
		case err != nil:
			fmt.Println("plugin could not read krane's environment:", err)
		case bytes.Contains(b, []byte("secret-token-of-the-test")):
			fmt.Println("plugin read the token")
		default:
			fmt.Println("plugin read krane's environment, without the token")
		}
	}
}
