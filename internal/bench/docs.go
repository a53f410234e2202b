package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The documentation's tables of figures are blocks between a start marker
// and an end marker, generated from results.json and never edited by
// hand:
//
//	<!-- bench:figures propagation,bootstrap -->   every figure of these sections
//	<!-- bench:pivot fleet -->                     a section whose keys are ROW/COLUMN, as a grid
//	<!-- bench:provenance -->                      the run behind every section shown in the file
//	<!-- bench:cited -->                           the figures from elsewhere, with their sources
//	<!-- bench:sizing -->                          ctrl's and MariaDB's sizing by fleet size (Sizing), from section fleet
//	<!-- bench:end -->
//
// UpdateDocs rewrites the blocks (a bench run, or `make bench-docs`);
// CheckDocs reports blocks that differ from what results.json says.

// DocFiles are the files, relative to the repository's root, whose blocks
// the bench keeps.
var DocFiles = []string{"README.md", "docs/scaling.md", "docs/operating.md", "docs/sentinel.md"}

const (
	markerStart = "<!-- bench:"
	markerEnd   = "<!-- bench:end -->"
)

// block is one marked block of a file.
type block struct {
	kind, arg  string
	start, end int // line numbers of the markers
}

func blocks(lines []string, file string) ([]block, error) {
	var out []block
	open := -1
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case l == markerEnd:
			if open < 0 {
				return nil, fmt.Errorf("%s:%d: %s without a start marker", file, i+1, markerEnd)
			}
			out[len(out)-1].end, open = i, -1
		case strings.HasPrefix(l, markerStart) && strings.HasSuffix(l, "-->"):
			if open >= 0 {
				return nil, fmt.Errorf("%s:%d: a bench block starts inside the one of line %d", file, i+1, open+1)
			}
			spec := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, markerStart), "-->"))
			kind, arg, _ := strings.Cut(spec, " ")
			out = append(out, block{kind: kind, arg: strings.TrimSpace(arg), start: i})
			open = i
		}
	}
	if open >= 0 {
		return nil, fmt.Errorf("%s:%d: bench block without %s", file, open+1, markerEnd)
	}
	return out, nil
}

// renderFile returns the file with every block generated anew.
func renderFile(text, file string, r *Results) (string, error) {
	lines := strings.Split(text, "\n")
	bs, err := blocks(lines, file)
	if err != nil {
		return "", err
	}
	// The sections this file shows, for its provenance block.
	var shown []string
	for _, b := range bs {
		if b.kind == "sizing" && !contains(shown, "fleet") {
			shown = append(shown, "fleet")
		}
		if b.kind == "figures" || b.kind == "pivot" {
			for _, s := range strings.Split(b.arg, ",") {
				if !contains(shown, s) {
					shown = append(shown, s)
				}
			}
		}
	}
	var out []string
	prev := 0
	var errs []error
	for _, b := range bs {
		out = append(out, lines[prev:b.start+1]...)
		body, err := renderBlock(b, r, shown)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", file, b.start+1, err))
		}
		out = append(out, body...)
		prev = b.end
	}
	out = append(out, lines[prev:]...)
	return strings.Join(out, "\n"), errors.Join(errs...)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func renderBlock(b block, r *Results, shown []string) ([]string, error) {
	sections := func(arg string) ([]Section, error) {
		var out []Section
		for _, name := range strings.Split(arg, ",") {
			s, ok := r.Section(strings.TrimSpace(name))
			if !ok {
				return nil, fmt.Errorf("section %q is not in results.json: a bench run measures it (make bench, make bench-fleet, or go run ./cmd/bench -bin bin [-fleet] -only %s)", name, name)
			}
			out = append(out, s)
		}
		return out, nil
	}
	switch b.kind {
	case "figures":
		ss, err := sections(b.arg)
		if err != nil {
			return nil, err
		}
		return figureTable(ss), nil
	case "pivot":
		ss, err := sections(b.arg)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range ss {
			out = append(out, pivotTable(s)...)
		}
		return out, nil
	case "provenance":
		arg := b.arg
		if arg == "" {
			arg = strings.Join(shown, ",")
		}
		ss, err := sections(arg)
		if err != nil {
			return nil, err
		}
		return provenanceTable(ss), nil
	case "sizing":
		return sizingTable(r)
	case "cited":
		out := []string{"", "| cited, not measured here | value | source |", "|---|---|---|"}
		for _, c := range Citations {
			out = append(out, fmt.Sprintf("| %s | %s | <%s> |", cell(c.What), c.Value, c.Source))
		}
		return append(out, ""), nil
	}
	return nil, fmt.Errorf("unknown bench block %q (figures, pivot, provenance, cited, sizing)", b.kind)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func value(f Figure) string {
	if f.Unit == "" {
		return Format(f.Value)
	}
	return Format(f.Value) + " " + f.Unit
}

func target(f Figure) string {
	if f.Target == nil {
		return ""
	}
	verdict := "**missed**"
	if f.Holds != nil && *f.Holds {
		verdict = "holds"
	}
	unit := ""
	if f.Unit != "" && f.Unit != "ratio" {
		unit = " " + f.Unit
	}
	return f.Target.String() + unit + ": " + verdict
}

// figureTable lists every figure of the sections.
func figureTable(ss []Section) []string {
	out := []string{"", "| measurement | figure | value | target | note |", "|---|---|---|---|---|"}
	for _, s := range ss {
		for i, f := range s.Figures {
			name := ""
			if i == 0 {
				name = s.Name
			}
			out = append(out, fmt.Sprintf("| %s | %s | %s | %s | %s |", name, cell(f.Name), value(f), target(f), cell(f.Note)))
		}
	}
	return append(out, "")
}

// pivotTable shows a section whose keys are ROW/COLUMN (the row may have
// slashes of its own) as a grid: a row per ROW, labelled with its
// figures' name up to ": ", a column per COLUMN, headed with the name
// after it. Targets follow the grid as a list.
func pivotTable(s Section) []string {
	var rows, cols []string
	label, head := map[string]string{}, map[string]string{}
	cells := map[[2]string]Figure{}
	for _, f := range s.Figures {
		i := strings.LastIndexByte(f.Key, '/')
		if i < 0 {
			continue
		}
		row, col := f.Key[:i], f.Key[i+1:]
		if !contains(rows, row) {
			rows = append(rows, row)
		}
		if !contains(cols, col) {
			cols = append(cols, col)
		}
		l, h, ok := strings.Cut(f.Name, ": ")
		if !ok {
			l, h = row, f.Name
		}
		label[row] = l
		if f.Unit != "" {
			h += " (" + f.Unit + ")"
		}
		head[col] = h
		cells[[2]string{row, col}] = f
	}
	hdr, sep := "| |", "|---|"
	for _, c := range cols {
		hdr += " " + cell(head[c]) + " |"
		sep += "---|"
	}
	out := []string{"", hdr, sep}
	for _, r := range rows {
		line := "| " + cell(label[r]) + " |"
		for _, c := range cols {
			if f, ok := cells[[2]string{r, c}]; ok {
				line += " " + Format(f.Value) + " |"
			} else {
				line += " |"
			}
		}
		out = append(out, line)
	}
	out = append(out, "")
	var targets []string
	for _, f := range s.Figures {
		if f.Target != nil {
			targets = append(targets, fmt.Sprintf("- %s: %s; target %s", f.Name, value(f), target(f)))
		}
	}
	if len(targets) > 0 {
		out = append(append(append(out, "Targets:", ""), targets...), "")
	}
	return out
}

// provenanceTable says which run measured each section.
func provenanceTable(ss []Section) []string {
	out := []string{"", "| measurement | commit | started (UTC) | took | machine: load, busy cores | command |", "|---|---|---|---|---|---|"}
	for _, s := range ss {
		p := s.Provenance
		commit := p.Commit
		if len(commit) > 12 {
			commit = commit[:12]
		}
		if p.Dirty {
			commit += " (uncommitted changes)"
		}
		out = append(out, fmt.Sprintf("| %s | %s | %s | %s | load %.1f, %.2f of %d cores busy | `%s` |", s.Name, commit,
			p.Started.UTC().Format("2006-01-02 15:04"), (time.Duration(p.Seconds)*time.Second).String(), p.LoadAvg, p.BusyCores, p.Cores, p.Command))
	}
	return append(out, "")
}

// UpdateDocs rewrites the blocks of every file of DocFiles under root
// from r.
func UpdateDocs(root string, r *Results) error {
	for _, f := range DocFiles {
		path := filepath.Join(root, f)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text, err := renderFile(string(b), f, r)
		if err != nil {
			return err
		}
		if text != string(b) {
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckDocs reports every block under root that is not what r makes of
// it, and every section of r that is unfit to publish.
func CheckDocs(root string, r *Results) error {
	errs := []error{r.Check()}
	for _, f := range DocFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		text, err := renderFile(string(b), f, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if text != string(b) {
			errs = append(errs, fmt.Errorf("%s: a figure block differs from bench/results.json (first difference at line %d): figures come from a bench run; `make bench-docs` rewrites the blocks from results.json", f, firstDiff(string(b), text)))
		}
	}
	return errors.Join(errs...)
}

func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
