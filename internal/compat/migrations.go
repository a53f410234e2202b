package compat

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/semver"

	"krane.dev/ctrl/store"
)

// Violation is one broken rule of docs/compatibility.md.
type Violation struct {
	Where, Rule string
}

func (v Violation) String() string { return v.Where + ": " + v.Rule }

// SQLNames are, per Go file of a tree, the words its string literals
// hold: what its queries may name.
type SQLNames map[string]map[string]bool

// Names reports whether some file's literals hold every word.
func (n SQLNames) Names(words ...string) (string, bool) {
	for file, ws := range n {
		all := true
		for _, w := range words {
			if !ws[strings.ToLower(w)] {
				all = false
				break
			}
		}
		if all {
			return file, true
		}
	}
	return "", false
}

// ReadSQLNames reads the words of the string literals of every non-test
// Go file under dir (a tree's ctrl/, where its queries are).
func ReadSQLNames(dir string) (SQLNames, error) {
	out := SQLNames{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		words := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for _, w := range strings.FieldsFunc(s, func(r rune) bool {
					return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
				}) {
					words[strings.ToLower(w)] = true
				}
			}
			return true
		})
		rel, _ := filepath.Rel(dir, p)
		out[rel] = words
		return nil
	})
	return out, err
}

// MigrationSet is a tree's migrations: what each declares, and its bytes.
type MigrationSet struct {
	Infos []store.MigrationInfo
	Files map[string][]byte
}

// ReadMigrations reads a migrations directory.
func ReadMigrations(fsys fs.FS) (MigrationSet, error) {
	infos, err := store.MigrationsIn(fsys)
	if err != nil {
		return MigrationSet{}, err
	}
	set := MigrationSet{Infos: infos, Files: map[string][]byte{}}
	for _, m := range infos {
		if set.Files[m.Name], err = fs.ReadFile(fsys, m.Name); err != nil {
			return set, err
		}
	}
	return set, nil
}

// ReadMigrationsDir reads a tree's ctrl/store/migrations.
func ReadMigrationsDir(tree string) (MigrationSet, error) {
	return ReadMigrations(os.DirFS(filepath.Join(tree, "ctrl", "store", "migrations")))
}

// CheckMigrations holds cur, this tree's migrations, to the rules against
// base, the baseline release's (of minor line baseLine), whose queries
// name baseNames:
//
//   - a released migration never changes (databases already ran it);
//   - every new migration declares its phase;
//   - an expand step removes nothing and narrows nothing (store.Destructive):
//     replicas of the previous release keep working while and after it
//     runs; and its ALTER TABLE statements ask for online DDL
//     (store.OfflineDDL);
//   - a contract step completes an expand step of a released version (the
//     two never land in one release), needs at least the baseline's ctrl
//     line, and removes nothing the baseline's queries still name.
func CheckMigrations(base, cur MigrationSet, baseLine string, baseNames SQLNames) []Violation {
	var out []Violation
	released := map[int64]store.MigrationInfo{}
	for _, m := range base.Infos {
		released[m.Version] = m
	}
	for _, m := range cur.Infos {
		where := "ctrl/store/migrations/" + m.Name
		if old, ok := released[m.Version]; ok {
			if old.Name != m.Name || !bytes.Equal(base.Files[old.Name], cur.Files[m.Name]) {
				out = append(out, Violation{where, fmt.Sprintf("migration %05d was released as %s and databases ran it; a released migration never changes: undo the change and add a new migration", m.Version, old.Name)})
			}
			continue
		}
		removals, others := store.Destructive(m.Up)
		switch m.Phase {
		case "":
			out = append(out, Violation{where, "a new migration declares its phase: -- krane:phase expand (additive) or contract (removes what the previous release no longer reads)"})
		case store.Expand:
			for _, r := range removals {
				out = append(out, Violation{where, fmt.Sprintf("an expand step removes %s (%s): replicas of the previous release still read it during a roll; make it a contract step of the next release", r, r.Statement)})
			}
			for _, o := range others {
				out = append(out, Violation{where, "an expand step must leave the previous release working: " + o})
			}
			for _, stmt := range store.OfflineDDL(m.Up) {
				out = append(out, Violation{where, "an expand step's ALTER TABLE runs while every replica serves: ask for online DDL (ALGORITHM=INSTANT, or ALGORITHM=INPLACE, LOCK=NONE), so a server that would copy the table under a lock refuses instead: " + stmt})
			}
		case store.Contract:
			if _, ok := released[m.Contracts]; !ok {
				out = append(out, Violation{where, fmt.Sprintf("contracts %05d, which is not in a released version: its expand step and this contract step would land in one release, so replicas of the previous release would lose what they read mid-roll; ship the contract step a release later", m.Contracts)})
			}
			if semver.Compare(m.RequiresCtrl, baseLine) < 0 {
				out = append(out, Violation{where, fmt.Sprintf("requires-ctrl %s is older than the baseline's line %s, which a contract step of this release can at least require", m.RequiresCtrl, baseLine)})
			}
			for _, r := range removals {
				words := []string{r.Table}
				if r.Column != "" {
					words = append(words, r.Column)
				}
				if file, named := baseNames.Names(words...); named {
					out = append(out, Violation{where, fmt.Sprintf("removes %s, which the baseline's queries still name (ctrl/%s): replicas of the previous release would fail; keep it until a release that no longer reads it", r, file)})
				}
			}
		}
	}
	return out
}
