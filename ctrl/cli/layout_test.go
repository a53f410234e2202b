package cli_test

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/cli"
)

// TestOneOutputVocabulary: every command that prints a result takes the
// same -o (table, json or yaml), so there is one vocabulary to learn.
func TestOneOutputVocabulary(t *testing.T) {
	usages := map[string][]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		f := c.Flags().Lookup("output")
		if f == nil {
			f = c.InheritedFlags().Lookup("output")
		}
		if f != nil && c.Runnable() {
			usages[f.Usage] = append(usages[f.Usage], c.CommandPath())
			if f.Shorthand != "o" || f.DefValue != "table" {
				t.Errorf("%s: -o/--output default %q shorthand %q, want -o defaulting to table", c.CommandPath(), f.DefValue, f.Shorthand)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cli.NewRoot())
	if len(usages) != 1 {
		t.Fatalf("%d -o vocabularies, want 1: %v", len(usages), usages)
	}
	for usage, cmds := range usages {
		if !strings.Contains(usage, "table, json") || !strings.Contains(usage, "yaml") || len(cmds) < 10 {
			t.Fatalf("-o of %d commands reads %q", len(cmds), usage)
		}
	}
}

// TestAdminHoldsTheDatabaseCommands: the commands that go straight to the
// database are under `ctrl admin`; their old top-level spellings still
// run, hidden from help.
func TestAdminHoldsTheDatabaseCommands(t *testing.T) {
	root := cli.NewRoot()
	for _, path := range [][]string{{"admin", "migrate"}, {"admin", "cluster", "register"}, {"admin", "cluster", "list"}, {"admin", "token", "create-operator"}, {"admin", "token", "revoke"}} {
		c, rest, err := root.Find(path)
		if err != nil || len(rest) != 0 || c.Name() != path[len(path)-1] {
			t.Errorf("ctrl %s: not found (%v)", strings.Join(path, " "), err)
		}
	}
	for _, old := range []string{"migrate", "cluster", "token"} {
		c, _, err := root.Find([]string{old})
		if err != nil || c.Name() != old || !c.Hidden {
			t.Errorf("ctrl %s: the old spelling should run, hidden (found %v, err %v)", old, c, err)
		}
	}
	code, out, _ := run(t, "--help")
	if code != 0 || !strings.Contains(out, "admin") {
		t.Fatalf("ctrl --help does not list admin:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "cluster" || f[0] == "token" || f[0] == "migrate") {
			t.Errorf("ctrl --help lists the old spelling %q", f[0])
		}
	}
}
