package store

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pressly/goose/v3"
	"golang.org/x/mod/semver"
)

// Phase is what a migration does to the releases that run beside it
// (docs/compatibility.md, "Migrations"):
//
//   - Expand adds (tables, nullable or defaulted columns, indexes, rows,
//     backfills): ctrl of the previous release keeps working on the
//     schema after it, so a roll may migrate while old replicas serve.
//   - Contract removes or narrows what the previous release no longer
//     reads (drops, renames, NOT NULL on a backfilled column). It lands a
//     release after the expand step it completes and names it.
//
// Migrations of the first release (v0.1.0) predate phases and declare
// none.
type Phase string

const (
	Expand   Phase = "expand"
	Contract Phase = "contract"
)

// MigrationInfo is what one migration declares of itself, in comment
// lines at the top of its file:
//
//	-- krane:phase expand
//
//	-- krane:phase contract
//	-- krane:contracts 00060
//	-- krane:requires-ctrl v0.2
type MigrationInfo struct {
	Version int64
	Name    string // the file name
	Phase   Phase  // "" before phases were declared
	// Contracts is, for a contract step, the expand step it completes.
	Contracts int64
	// RequiresCtrl is, for a contract step, the oldest minor line of ctrl
	// that can serve the schema after it ("v0.2"); ctrl older than that
	// says so and stays unready (SchemaStatus).
	RequiresCtrl string
	// Up is the SQL of the migration's Up section.
	Up string
}

var directiveRE = regexp.MustCompile(`^--\s*krane:([a-z-]+)\s+(\S+)\s*$`)

// ParseMigration reads a migration file's declarations and Up section.
func ParseMigration(name string, data []byte) (MigrationInfo, error) {
	v, err := goose.NumericComponent(name)
	if err != nil {
		return MigrationInfo{}, fmt.Errorf("migration %s: %w", name, err)
	}
	m := MigrationInfo{Version: v, Name: name}
	var up strings.Builder
	inUp := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "-- +goose Up"):
			inUp = true
			continue
		case strings.HasPrefix(line, "-- +goose Down"):
			inUp = false
			continue
		}
		if d := directiveRE.FindStringSubmatch(line); d != nil {
			switch d[1] {
			case "phase":
				if d[2] != string(Expand) && d[2] != string(Contract) {
					return m, fmt.Errorf("migration %s: krane:phase %q: want expand or contract", name, d[2])
				}
				m.Phase = Phase(d[2])
			case "contracts":
				if m.Contracts, err = strconv.ParseInt(d[2], 10, 64); err != nil {
					return m, fmt.Errorf("migration %s: krane:contracts %q: want the version of the expand step it completes (e.g. 00060)", name, d[2])
				}
			case "requires-ctrl":
				if !semver.IsValid(d[2]) || semver.MajorMinor(d[2]) != d[2] {
					return m, fmt.Errorf("migration %s: krane:requires-ctrl %q: want a minor line such as v0.2", name, d[2])
				}
				m.RequiresCtrl = d[2]
			default:
				return m, fmt.Errorf("migration %s: unknown declaration krane:%s (want phase, contracts or requires-ctrl)", name, d[1])
			}
			continue
		}
		if inUp {
			up.WriteString(sc.Text())
			up.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("migration %s: %w", name, err)
	}
	m.Up = up.String()
	if m.Phase == Contract && (m.Contracts == 0 || m.RequiresCtrl == "") {
		return m, fmt.Errorf("migration %s: a contract step declares krane:contracts (the expand step it completes) and krane:requires-ctrl (the oldest ctrl line that serves the schema after it)", name)
	}
	if m.Phase != Contract && (m.Contracts != 0 || m.RequiresCtrl != "") {
		return m, fmt.Errorf("migration %s: krane:contracts and krane:requires-ctrl belong to contract steps", name)
	}
	return m, nil
}

// MigrationsIn reads the migrations of a directory like ctrl/store/migrations.
func MigrationsIn(fsys fs.FS) ([]MigrationInfo, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var out []MigrationInfo
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		m, err := ParseMigration(e.Name(), data)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b MigrationInfo) int { return int(a.Version - b.Version) })
	return out, nil
}

// Removal is a table, or a column of a table, that a statement removes or
// renames away.
type Removal struct {
	Table, Column string // Column "" for the whole table
	Statement     string
}

func (r Removal) String() string {
	if r.Column == "" {
		return "table " + r.Table
	}
	return "column " + r.Table + "." + r.Column
}

// Destructive is what in a migration's Up section an expand step must not
// do: the removals, and the statements that narrow or rewrite what old
// replicas read or write (MODIFY, CHANGE, a NOT NULL column without a
// default, TRUNCATE, DELETE), each with the reason.
func Destructive(up string) (removals []Removal, others []string) {
	for _, stmt := range statements(up) {
		toks := tokens(stmt)
		upper := make([]string, len(toks))
		for i, t := range toks {
			upper[i] = strings.ToUpper(t)
		}
		at := func(i int) string {
			if i < len(upper) {
				return upper[i]
			}
			return ""
		}
		name := func(i int) string {
			if i < len(toks) {
				return strings.Trim(toks[i], "`")
			}
			return ""
		}
		short := stmt
		if len(short) > 120 {
			short = short[:120] + "..."
		}
		switch {
		case at(0) == "DROP" && at(1) == "TABLE":
			i := 2
			if at(2) == "IF" && at(3) == "EXISTS" {
				i = 4
			}
			for ; i < len(toks); i++ {
				if toks[i] != "," {
					removals = append(removals, Removal{Table: name(i), Statement: short})
				}
			}
			continue
		case at(0) == "RENAME" && at(1) == "TABLE":
			removals = append(removals, Removal{Table: name(2), Statement: short})
			continue
		case at(0) == "TRUNCATE":
			others = append(others, "TRUNCATE deletes every row old replicas read: "+short)
			continue
		case at(0) == "DELETE":
			others = append(others, "DELETE removes rows old replicas may read: "+short)
			continue
		case at(0) != "ALTER" || at(1) != "TABLE":
			continue
		}
		table := name(2)
		// Each clause of ALTER TABLE t clause, clause, ...
		for i := 3; i < len(upper); i++ {
			if i > 3 && upper[i-1] != "," {
				continue
			}
			switch upper[i] {
			case "DROP":
				j := i + 1
				switch at(j) {
				case "INDEX", "KEY", "FOREIGN", "PRIMARY", "CONSTRAINT", "CHECK", "PARTITION":
					continue // old queries do not name an index
				case "COLUMN":
					j++
				}
				if at(j) == "IF" && at(j+1) == "EXISTS" {
					j += 2
				}
				removals = append(removals, Removal{Table: table, Column: name(j), Statement: short})
			case "RENAME":
				j := i + 1
				switch at(j) {
				case "COLUMN":
					removals = append(removals, Removal{Table: table, Column: name(j + 1), Statement: short})
				case "INDEX", "KEY":
				default: // RENAME [TO|AS] new_name: the table
					removals = append(removals, Removal{Table: table, Statement: short})
				}
			case "CHANGE":
				j := i + 1
				if at(j) == "COLUMN" {
					j++
				}
				if !strings.EqualFold(name(j), name(j+1)) {
					removals = append(removals, Removal{Table: table, Column: name(j), Statement: short})
				} else {
					others = append(others, "CHANGE rewrites column "+table+"."+name(j)+" under old replicas: "+short)
				}
			case "MODIFY":
				j := i + 1
				if at(j) == "COLUMN" {
					j++
				}
				others = append(others, "MODIFY narrows or rewrites column "+table+"."+name(j)+" under old replicas: "+short)
			case "ADD":
				j := i + 1
				if at(j) == "COLUMN" {
					j++
				}
				switch at(j) {
				case "INDEX", "KEY", "UNIQUE", "CONSTRAINT", "FOREIGN", "PRIMARY", "FULLTEXT", "SPATIAL", "PARTITION":
					continue
				}
				if notNullWithoutDefault(upper[j:]) {
					others = append(others, "ADD COLUMN "+table+"."+name(j)+" is NOT NULL without a DEFAULT: old replicas' INSERTs, which do not name it, fail: "+short)
				}
			}
		}
	}
	return removals, others
}

// notNullWithoutDefault reports whether a column definition (its tokens,
// upper-cased, up to the clause's end) says NOT NULL and gives no DEFAULT.
func notNullWithoutDefault(def []string) bool {
	notNull, dflt := false, false
	depth := 0
	for i, t := range def {
		switch t {
		case "(":
			depth++
		case ")":
			depth--
		case ",":
			if depth == 0 {
				return notNull && !dflt
			}
		case "NOT":
			if i+1 < len(def) && def[i+1] == "NULL" {
				notNull = true
			}
		case "DEFAULT", "AUTO_INCREMENT":
			dflt = true
		case "GENERATED", "AS":
			dflt = true // a generated column has its value
		}
	}
	return notNull && !dflt
}

// statements splits SQL into statements, without comments.
func statements(sql string) []string {
	var out []string
	var b strings.Builder
	inStr := byte(0)
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		if inStr != 0 {
			b.WriteByte(c)
			if c == '\\' && i+1 < len(sql) {
				i++
				b.WriteByte(sql[i])
			} else if c == inStr {
				inStr = 0
			}
			continue
		}
		switch {
		case c == '\'' || c == '"' || c == '`':
			inStr = c
			b.WriteByte(c)
		case c == '-' && strings.HasPrefix(sql[i:], "--"), c == '#':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
			b.WriteByte(' ')
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				i = len(sql)
			} else {
				i += end + 3
			}
			b.WriteByte(' ')
		case c == ';':
			if s := strings.TrimSpace(b.String()); s != "" {
				out = append(out, s)
			}
			b.Reset()
		default:
			b.WriteByte(c)
		}
	}
	if s := strings.TrimSpace(b.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// tokens splits a statement into words, quoted names, strings and the
// punctuation ( ) , .
func tokens(stmt string) []string {
	var out []string
	for i := 0; i < len(stmt); {
		c := stmt[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == ',' || c == '.' || c == '=':
			out = append(out, string(c))
			i++
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for j < len(stmt) && stmt[j] != c {
				if stmt[j] == '\\' {
					j++
				}
				j++
			}
			out = append(out, stmt[i:min(j+1, len(stmt))])
			i = j + 1
		default:
			j := i
			for j < len(stmt) && !strings.ContainsRune(" \t\n\r(),.=`'\"", rune(stmt[j])) {
				j++
			}
			out = append(out, stmt[i:j])
			i = j
		}
	}
	return out
}

// OfflineDDL lists the ALTER TABLE statements of a migration's Up section
// that do not ask for online DDL: ALGORITHM=INSTANT, or ALGORITHM=INPLACE
// with LOCK=NONE. An expand step runs while every replica serves; a table
// copied under a lock would stall them for as long as the copy takes, and
// a server that cannot do the change online should refuse it at once
// instead (MariaDB and MySQL refuse an ALGORITHM they cannot honour).
func OfflineDDL(up string) []string {
	var out []string
	for _, stmt := range statements(up) {
		toks := tokens(stmt)
		if len(toks) < 2 || !strings.EqualFold(toks[0], "ALTER") || !strings.EqualFold(toks[1], "TABLE") {
			continue
		}
		opts := map[string]string{}
		for i := 0; i+2 < len(toks); i++ {
			if toks[i+1] == "=" {
				opts[strings.ToUpper(toks[i])] = strings.ToUpper(toks[i+2])
			}
		}
		if opts["ALGORITHM"] == "INSTANT" || opts["ALGORITHM"] == "INPLACE" && opts["LOCK"] == "NONE" {
			continue
		}
		if len(stmt) > 120 {
			stmt = stmt[:120] + "..."
		}
		out = append(out, stmt)
	}
	return out
}
