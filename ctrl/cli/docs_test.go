package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/cli"
)

// docCommand is one `ctrl ...` command the docs tell a reader to run.
type docCommand struct {
	where string   // file:line
	words []string // the command's words: subcommands, then arguments
}

var (
	// A command in an inline code span: the whole span is the command.
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// A command in a shell block: ctrl at the start, after `--` (kubectl
	// exec) or after a shell operator.
	shellCtrl = regexp.MustCompile(`(?:^|[\s;&|(])ctrl((?:\s+[a-z][a-z0-9-]*)+)`)
	// A word the command line resolves: a subcommand or a lowercase
	// argument; placeholders (KIND, ID), flags and paths end the command.
	cmdWord = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// docCommands finds the `ctrl` commands in a Markdown file: inline code
// spans that are a command (they may wrap across lines) and the lines of
// fenced shell blocks, comments dropped.
func docCommands(t *testing.T, path string) []docCommand {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []docCommand
	add := func(line int, text string) {
		var words []string
		for _, w := range strings.Fields(text) {
			if !cmdWord.MatchString(w) {
				break
			}
			words = append(words, w)
		}
		if len(words) > 0 {
			out = append(out, docCommand{where: path + ":" + strconv.Itoa(line), words: words})
		}
	}
	lines := strings.Split(string(data), "\n")
	var prose strings.Builder // the text outside fences, with line starts
	var starts []int
	fence, shell := false, false
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			fence = !fence
			shell = fence && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell")
			prose.WriteString("\n")
			starts = append(starts, prose.Len())
			continue
		}
		switch {
		case fence && shell:
			if c := strings.Index(line, " #"); c >= 0 {
				line = line[:c]
			}
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				line = ""
			}
			for _, m := range shellCtrl.FindAllStringSubmatch(line, -1) {
				add(i+1, m[1])
			}
			prose.WriteString("\n")
		case fence:
			prose.WriteString("\n")
		default:
			prose.WriteString(line + "\n")
		}
		starts = append(starts, prose.Len())
	}
	text := prose.String()
	for _, loc := range codeSpan.FindAllStringSubmatchIndex(text, -1) {
		span := strings.Join(strings.Fields(text[loc[2]:loc[3]]), " ")
		rest, ok := strings.CutPrefix(span, "ctrl ")
		if !ok || namesOldSpellings(text, loc[0]) {
			continue
		}
		line := 1
		for line <= len(starts) && starts[line-1] <= loc[0] {
			line++
		}
		add(line, rest)
	}
	return out
}

// namesOldSpellings says whether the paragraph around offset i is the one
// that lists the old spellings on purpose, to tell readers to move off
// them: it says they are "hidden from help".
func namesOldSpellings(text string, i int) bool {
	begin := strings.LastIndex(text[:i], "\n\n")
	end := strings.Index(text[i:], "\n\n")
	if end < 0 {
		end = len(text) - i
	}
	return strings.Contains(strings.Join(strings.Fields(text[begin+1:i+end]), " "), "hidden from help")
}

// TestDocsUseCurrentCommandSpellings: every `ctrl` command the docs tell an
// operator to run resolves to a command of this ctrl, spelled as its help
// shows it. The spellings from before `ctrl admin` still run for one
// release, hidden from help; docs that kept them would teach what goes
// away.
func TestDocsUseCurrentCommandSpellings(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../deploy/README.md")
	root := cli.NewRoot()
	checked := 0
	for _, f := range files {
		for _, c := range docCommands(t, f) {
			cmd, rest, err := root.Find(c.words)
			if err != nil || cmd == root {
				t.Errorf("%s: `ctrl %s`: no such command", c.where, strings.Join(c.words, " "))
				continue
			}
			if cmd.HasSubCommands() && !cmd.Runnable() && len(rest) > 0 {
				t.Errorf("%s: `ctrl %s`: %s has no subcommand %q", c.where, strings.Join(c.words, " "), cmd.CommandPath(), rest[0])
				continue
			}
			for p := cmd; p != nil; p = p.Parent() {
				if p.Hidden {
					t.Errorf("%s: `ctrl %s` is the old spelling, hidden from help: write `%s`", c.where, strings.Join(c.words, " "), current(root, cmd))
					break
				}
			}
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d `ctrl` commands in the docs; the extraction finds too few", checked)
	}
}

// current is the spelling help shows for a hidden command: the visible
// command with the same path under `ctrl admin`.
func current(root, old *cobra.Command) string {
	path := strings.Fields(old.CommandPath())[1:]
	if cmd, _, err := root.Find(append([]string{"admin"}, path...)); err == nil && !cmd.Hidden {
		return cmd.CommandPath()
	}
	return "the command ctrl --help lists"
}
