package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// ChangesAfter returns up to limit rows of kind in region with version >
// after, ordered by version, deleted rows included. By the stamping
// protocol the result is a gap-free prefix: a cursor set to the last
// version returned never skips a change that commits later.
func (s *Store) ChangesAfter(ctx context.Context, kind, region string, after uint64, limit int) ([]Change, error) {
	def := lookupKind(kind)
	q := def.selectFrom + " WHERE " + def.regionCond + " AND " + def.versionCol + " > ? ORDER BY " + def.versionCol + " LIMIT ?"
	args := append(def.regionArgs(kind, region), after, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read %s changes in %s after version %d: %w", kind, region, after, err)
	}
	return collect(rows, def, kind, limit)
}

func collect(rows *sql.Rows, def *kindDef, kind string, capHint int) ([]Change, error) {
	defer rows.Close()
	out := make([]Change, 0, min(capHint, 1024))
	for rows.Next() {
		c, err := def.scan(rows, kind)
		if err != nil {
			return nil, fmt.Errorf("store: scan %s row: %w", kind, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read %s rows: %w", kind, err)
	}
	return out, nil
}

// Snapshot is a read-only, consistent view of one kind in one region: the
// live rows with version <= Head, read page by page. It holds one database
// connection until Close.
type Snapshot struct {
	conn   *sql.Conn
	def    *kindDef
	kind   string
	region string
	head   uint64
	cursor uint64
	done   bool
}

// OpenSnapshot starts a snapshot of kind in region: START TRANSACTION WITH
// CONSISTENT SNAPSHOT, READ ONLY under REPEATABLE READ, so the sequence head
// and every page are read from the same moment.
func (s *Store) OpenSnapshot(ctx context.Context, kind, region string) (_ *Snapshot, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: get a connection for a snapshot of %s in %s: %w", kind, region, err)
	}
	sn := &Snapshot{conn: conn, def: lookupKind(kind), kind: kind, region: region}
	defer func() {
		if err != nil {
			sn.Close()
		}
	}()
	if _, err := conn.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		return nil, fmt.Errorf("store: begin snapshot of %s in %s: %w", kind, region, err)
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		return nil, fmt.Errorf("store: begin snapshot of %s in %s: %w", kind, region, err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT head FROM version_seq WHERE id = 1").Scan(&sn.head); err != nil {
		return nil, fmt.Errorf("store: read version head for a snapshot of %s in %s: %w", kind, region, err)
	}
	return sn, nil
}

// Head is the version the snapshot is consistent with: every live row with
// a version <= Head is in it, and nothing newer.
func (sn *Snapshot) Head() uint64 { return sn.head }

// Next returns the next page of at most limit live rows, ordered by
// version; an empty page means the snapshot is exhausted (see also Done). Paging is by
// version (keyset), so no page re-reads the rows before it.
func (sn *Snapshot) Next(ctx context.Context, limit int) ([]Change, error) {
	if sn.done {
		return nil, nil
	}
	def := sn.def
	q := def.selectFrom + " WHERE " + def.regionCond + " AND " + def.versionCol + " > ? AND " + def.versionCol + " <= ? AND " +
		def.liveCond + " ORDER BY " + def.versionCol + " LIMIT ?"
	args := append(def.regionArgs(sn.kind, sn.region), sn.cursor, sn.head, limit)
	rows, err := sn.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read %s snapshot page in %s after version %d: %w", sn.kind, sn.region, sn.cursor, err)
	}
	page, err := collect(rows, def, sn.kind, limit)
	if err != nil {
		return nil, err
	}
	if len(page) > 0 {
		sn.cursor = page[len(page)-1].Version
	}
	// A short page, or one ending at the head, is the last: saves a query.
	if len(page) < limit || sn.cursor >= sn.head {
		sn.done = true
	}
	return page, nil
}

// Done reports whether the last page was read (Next would not query).
func (sn *Snapshot) Done() bool { return sn.done }

// Close ends the snapshot's transaction and returns its connection to the
// pool, or discards the connection when the transaction could not be ended
// (it must never go back to the pool with a transaction open).
func (sn *Snapshot) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := sn.conn.ExecContext(ctx, "ROLLBACK")
	if err != nil {
		_ = sn.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	sn.conn.Close()
	return err
}

// Desired returns the current row of one object of kind in region (deleted
// rows included, as Deleted). ErrNotFound when there is none, or when it has
// never been stamped.
func (s *Store) Desired(ctx context.Context, kind, region, id string) (Change, error) {
	def := lookupKind(kind)
	q := def.selectFrom + " WHERE " + def.regionCond + " AND " + def.idCond + " AND " + def.versionCol + " > 0"
	args := append(def.regionArgs(kind, region), id)
	c, err := def.scan(s.db.QueryRowContext(ctx, q, args...), kind)
	if errors.Is(err, sql.ErrNoRows) {
		return Change{}, ErrNotFound
	}
	if err != nil {
		return Change{}, fmt.Errorf("store: read %s %s in %s: %w", kind, id, region, err)
	}
	return c, nil
}

// HeadKey names one (region, kind) pair of change_heads.
type HeadKey struct {
	Region string
	Kind   string
}

// ChangeHeads returns the newest version of every (region, kind) pair.
func (s *Store) ChangeHeads(ctx context.Context) (map[HeadKey]uint64, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT region, kind, head FROM change_heads")
	if err != nil {
		return nil, fmt.Errorf("store: read change heads: %w", err)
	}
	defer rows.Close()
	out := map[HeadKey]uint64{}
	for rows.Next() {
		var k HeadKey
		var h uint64
		if err := rows.Scan(&k.Region, &k.Kind, &h); err != nil {
			return nil, err
		}
		out[k] = h
	}
	return out, rows.Err()
}

// Head returns the newest version given out anywhere.
func (s *Store) Head(ctx context.Context) (uint64, error) {
	var h uint64
	if err := s.db.QueryRowContext(ctx, "SELECT head FROM version_seq WHERE id = 1").Scan(&h); err != nil {
		return 0, fmt.Errorf("store: read version head: %w", err)
	}
	return h, nil
}

// RegionHead returns the newest version of any kind in region (0 if none).
func (s *Store) RegionHead(ctx context.Context, region string) (uint64, error) {
	var h uint64
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(head), 0) FROM change_heads WHERE region = ?", region).Scan(&h); err != nil {
		return 0, fmt.Errorf("store: read head of region %s: %w", region, err)
	}
	return h, nil
}
