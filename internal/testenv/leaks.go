package testenv

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// LeakForms are the forms a leaked value could take in a text column or a
// log line: as is, base64 (standard and URL) and hex.
func LeakForms(v string) []string {
	b := []byte(v)
	return []string{v, base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
		base64.RawURLEncoding.EncodeToString(b), hex.EncodeToString(b)}
}

// FindInDatabase reads every row of every table of the database db is
// connected to and returns "table.column" for each cell that contains one
// of needles (in any of its LeakForms). It proves what is not stored.
func FindInDatabase(ctx context.Context, db *sql.DB, needles ...string) ([]string, int, error) {
	rows, err := db.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE'")
	if err != nil {
		return nil, 0, err
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, 0, err
		}
		tables = append(tables, name)
	}
	rows.Close()
	var forms []string
	for _, n := range needles {
		forms = append(forms, LeakForms(n)...)
	}
	var found []string
	cells := 0
	for _, table := range tables {
		rows, err := db.QueryContext(ctx, "SELECT * FROM `"+table+"`")
		if err != nil {
			return nil, 0, fmt.Errorf("read table %s: %w", table, err)
		}
		cols, _ := rows.Columns()
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return nil, 0, err
			}
			for i, v := range vals {
				cells++
				for _, f := range forms {
					if strings.Contains(string(v), f) {
						found = append(found, table+"."+cols[i])
					}
				}
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, 0, err
		}
	}
	return found, cells, nil
}
