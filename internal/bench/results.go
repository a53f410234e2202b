package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Results is bench/results.json: one section per measurement, each with
// the run that measured it. Only a bench run writes it (Run); a run of
// some measurements replaces their sections and keeps the others, each
// with its own provenance.
type Results struct {
	Sections []Section `json:"sections"`
}

// Section is what one measurement printed in one run.
type Section struct {
	// Name is the measurement's name, as -only names it.
	Name       string     `json:"name"`
	Provenance Provenance `json:"provenance"`
	Figures    []Figure   `json:"figures"`
}

// Provenance says which run produced a section, and on what machine.
type Provenance struct {
	// Commit is the repository's HEAD when the run started; Dirty is set
	// when the working tree had changes to anything but the files the
	// bench itself writes.
	Commit string `json:"commit"`
	Dirty  bool   `json:"dirty,omitempty"`
	// Started is when the measurement started, Seconds how long it took.
	Started time.Time `json:"started"`
	Seconds float64   `json:"took_seconds"`
	// Cores is the machine's CPU count; LoadAvg its 1-minute load average
	// (mean of the start and the end); BusyCores the CPU the whole
	// machine used meanwhile, every process included. A figure measured
	// with cores busy with other work is not a quiet machine's.
	Cores     int     `json:"cores"`
	LoadAvg   float64 `json:"loadavg_1m"`
	BusyCores float64 `json:"busy_cores"`
	// Command is the command that ran the measurement.
	Command string `json:"command"`
}

// Figure is one measured number.
type Figure struct {
	// Key names the figure within its section, stably: tables in the
	// documentation refer to figures by section and key.
	Key   string  `json:"key"`
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Target is what the figure should reach, Holds whether it did.
	Target *Target `json:"target,omitempty"`
	Holds  *bool   `json:"holds,omitempty"`
	Note   string  `json:"note,omitempty"`
}

// Target is a bound on a figure: Op is one of <, <=, >, >=, ==.
type Target struct {
	Op    string  `json:"op"`
	Value float64 `json:"value"`
}

// Below, AtMost, AtLeast and Exactly make targets.
func Below(v float64) *Target   { return &Target{"<", v} }
func AtMost(v float64) *Target  { return &Target{"<=", v} }
func AtLeast(v float64) *Target { return &Target{">=", v} }
func Exactly(v float64) *Target { return &Target{"==", v} }

// Met says whether v meets the target.
func (t Target) Met(v float64) bool {
	switch t.Op {
	case "<":
		return v < t.Value
	case "<=":
		return v <= t.Value
	case ">":
		return v > t.Value
	case ">=":
		return v >= t.Value
	default:
		return v == t.Value
	}
}

func (t Target) String() string {
	if t.Op == "==" {
		return Format(t.Value)
	}
	return t.Op + " " + Format(t.Value)
}

// Section returns the named section.
func (r *Results) Section(name string) (Section, bool) {
	i := slices.IndexFunc(r.Sections, func(s Section) bool { return s.Name == name })
	if i < 0 {
		return Section{}, false
	}
	return r.Sections[i], true
}

// Figure returns a section's figure by key.
func (s Section) Figure(key string) (Figure, bool) {
	i := slices.IndexFunc(s.Figures, func(f Figure) bool { return f.Key == key })
	if i < 0 {
		return Figure{}, false
	}
	return s.Figures[i], true
}

// Put replaces the sections of the same names as secs (or appends them),
// keeping every other section as it was.
func (r *Results) Put(secs ...Section) {
	for _, s := range secs {
		if i := slices.IndexFunc(r.Sections, func(o Section) bool { return o.Name == s.Name }); i >= 0 {
			r.Sections[i] = s
		} else {
			r.Sections = append(r.Sections, s)
		}
	}
}

// Check reports what makes the results unfit to publish: a section
// without provenance, a figure without a key, a key twice in a section,
// a target whose holds is missing or disagrees with the value.
func (r *Results) Check() error {
	var errs []error
	seen := map[string]bool{}
	for _, s := range r.Sections {
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("section %q appears twice", s.Name))
		}
		seen[s.Name] = true
		p := s.Provenance
		if p.Commit == "" || p.Started.IsZero() || p.Cores <= 0 || p.Command == "" {
			errs = append(errs, fmt.Errorf("section %q lacks provenance (commit, started, cores and command are required): only a bench run may write it", s.Name))
		}
		if len(s.Figures) == 0 {
			errs = append(errs, fmt.Errorf("section %q has no figures", s.Name))
		}
		keys := map[string]bool{}
		for _, f := range s.Figures {
			if f.Key == "" || keys[f.Key] {
				errs = append(errs, fmt.Errorf("section %q: figure %q has an empty or repeated key %q", s.Name, f.Name, f.Key))
			}
			keys[f.Key] = true
			if f.Target != nil && (f.Holds == nil || *f.Holds != f.Target.Met(f.Value)) {
				errs = append(errs, fmt.Errorf("section %q: figure %q: holds is not what its target says of its value", s.Name, f.Key))
			}
		}
	}
	return errors.Join(errs...)
}

// ReadResults reads a results file; a missing file is empty results.
func ReadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Results{}, nil
	}
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (only a bench run writes it: run one, or restore the file from git)", path, err)
	}
	return &r, nil
}

// Write writes the results to path.
func (r *Results) Write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// settle fills in whether each target holds.
func settle(figs []Figure) {
	for i := range figs {
		if t := figs[i].Target; t != nil {
			ok := t.Met(figs[i].Value)
			figs[i].Holds = &ok
		} else {
			figs[i].Holds = nil
		}
	}
}

// Format writes a figure's value the way every table shows it: three
// significant digits or so, thousands separated.
func Format(v float64) string {
	var s string
	switch a := abs(v); {
	case a == 0:
		return "0"
	case a < 0.01:
		return strconv.FormatFloat(v, 'g', 3, 64)
	case a >= 100:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	}
	return thousands(s)
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// thousands puts commas into the integer part of a formatted number.
func thousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if hasFrac {
		return sign + b.String() + "." + frac
	}
	return sign + b.String()
}
