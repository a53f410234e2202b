package store

import (
	"context"
	"fmt"
	"strings"
)

// Deferred writes. Under group commit the callers' functions run one after
// another on the batch's connection, so every statement a function sends
// is a round trip every later caller of the batch waits for. The writes a
// function needs no answer from (a scale's UPDATEs, a history entry) are
// therefore not sent when it makes them: they are kept, and sent with the
// batch's other kept writes as one multi-row statement per table, before
// the batch is stamped.
//
// What a function reads stays what it would read had each write been sent
// at once. A Tx sends the kept writes (the batch's, then its own) before
// any statement it runs, except before the reads that name the one
// deployment they read (LockDeployment, ScaleTopology): those send them
// only when that deployment has a scale kept. The batch's kept writes
// belong to the callers before this one, so they go before this caller's
// savepoint; this caller's own go after it. A caller whose function fails
// has its kept writes dropped, never sent; a caller that sent nothing
// needs no savepoint at all (it is taken before its first write), and its
// failure rolls nothing back.

// deferredWrites are writes kept for sending later.
type deferredWrites struct {
	scales []deferredScale
	events []deferredEvent
	// scaled names the deployments with a scale kept: a read of one of
	// them must send the kept writes first.
	scaled map[string]bool
}

// deferredScale sets a deployment's replicas and those of its running
// topology rows in regions (rows the caller has locked).
type deferredScale struct {
	id       string
	regions  []string
	replicas int32
}

// deferredEvent is a history entry; its seq is given when it is sent.
type deferredEvent struct {
	id, status, message string
	at                  int64
}

func (d *deferredWrites) empty() bool { return len(d.scales) == 0 && len(d.events) == 0 }

func (d *deferredWrites) addScale(s deferredScale) {
	d.scales = append(d.scales, s)
	if d.scaled == nil {
		d.scaled = map[string]bool{}
	}
	d.scaled[s.id] = true
}

// take moves o's writes after d's (a caller kept in the batch).
func (d *deferredWrites) take(o *deferredWrites) {
	for _, s := range o.scales {
		d.addScale(s)
	}
	d.events = append(d.events, o.events...)
	*o = deferredWrites{}
}

// send runs the kept writes, at most one statement per table and
// rowsPerStatement rows, and forgets them. Kept in order: a deployment
// scaled twice ends with the later count, its history entries get
// consecutive seqs in the order they were kept.
func (d *deferredWrites) send(ctx context.Context, tx execer) error {
	if d.empty() {
		return nil
	}
	scales, events := d.scales, d.events
	*d = deferredWrites{}
	now := nowMillis()
	if len(scales) > 0 {
		// The later scale of a deployment wins.
		last := map[string]int{}
		var ids []string
		for i, s := range scales {
			if _, ok := last[s.id]; !ok {
				ids = append(ids, s.id)
			}
			last[s.id] = i
		}
		for len(ids) > 0 {
			chunk := ids[:min(len(ids), rowsPerStatement)]
			ids = ids[len(chunk):]
			var sb strings.Builder
			args := make([]any, 0, 3*len(chunk)+1)
			sb.WriteString("UPDATE deployments SET replicas = CASE id")
			for _, id := range chunk {
				sb.WriteString(" WHEN ? THEN ?")
				args = append(args, id, scales[last[id]].replicas)
			}
			sb.WriteString(" ELSE replicas END, updated_at = ? WHERE id IN (" + placeholders(len(chunk)) + ")")
			args = append(args, now)
			for _, id := range chunk {
				args = append(args, id)
			}
			if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
				return fmt.Errorf("store: set replicas of %d deployments (first %s): %w", len(chunk), chunk[0], err)
			}
		}
		type row struct{ id, region string }
		replicas := map[row]int32{}
		var rows []row
		for _, s := range scales {
			for _, region := range s.regions {
				r := row{s.id, region}
				if _, ok := replicas[r]; !ok {
					rows = append(rows, r)
				}
				replicas[r] = s.replicas
			}
		}
		for len(rows) > 0 {
			chunk := rows[:min(len(rows), rowsPerStatement)]
			rows = rows[len(chunk):]
			var set, cond strings.Builder
			setArgs := make([]any, 0, 3*len(chunk))
			condArgs := make([]any, 0, 2*len(chunk))
			for i, r := range chunk {
				set.WriteString(" WHEN deployment_id = ? AND region = ? THEN ?")
				setArgs = append(setArgs, r.id, r.region, replicas[r])
				if i > 0 {
					cond.WriteString(" OR ")
				}
				cond.WriteString("(deployment_id = ? AND region = ?)")
				condArgs = append(condArgs, r.id, r.region)
			}
			// Primary-key lookups only (see rowsCond): the rows are locked
			// already, and a scan would lock rows of other deployments.
			query := "UPDATE deployment_topology FORCE INDEX (PRIMARY) SET desired_replicas = CASE" + set.String() +
				" ELSE desired_replicas END, updated_at = ? WHERE " + cond.String()
			args := append(append(setArgs, now), condArgs...)
			if _, err := tx.ExecContext(ctx, query, args...); err != nil {
				return fmt.Errorf("store: scale %d topology rows (first deployment %s in %s): %w", len(chunk), chunk[0].id, chunk[0].region, err)
			}
		}
	}
	for len(events) > 0 {
		chunk := events[:min(len(events), rowsPerStatement)]
		events = events[len(chunk):]
		if err := sendEvents(ctx, tx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// sendEvents appends history entries in one statement: the n-th entry of
// a deployment in events gets seq = (its highest seq so far) + n. The
// writers of a deployment's history hold its row lock, so nobody else
// appends to it in between.
func sendEvents(ctx context.Context, tx execer, events []deferredEvent) error {
	nth := map[string]int{}
	var ids []string
	var values strings.Builder
	args := make([]any, 0, 5*len(events)+len(events))
	for i, e := range events {
		if nth[e.id] == 0 {
			ids = append(ids, e.id)
		}
		nth[e.id]++
		if i == 0 {
			values.WriteString("SELECT ? AS deployment_id, ? AS n, ? AS status, ? AS message, ? AS created_at")
		} else {
			values.WriteString(" UNION ALL SELECT ?, ?, ?, ?, ?")
		}
		args = append(args, e.id, nth[e.id], e.status, nullString(e.message), e.at)
	}
	for _, id := range ids {
		args = append(args, id)
	}
	// The highest seqs are read in a derived table: MySQL allows the
	// target table of INSERT ... SELECT in the FROM clause (it reads it
	// completely before inserting).
	query := `INSERT INTO deployment_events (deployment_id, seq, status, message, created_at)
SELECT v.deployment_id, COALESCE(m.seq, 0) + v.n, v.status, v.message, v.created_at
FROM (` + values.String() + `) AS v
LEFT JOIN (SELECT deployment_id, MAX(seq) AS seq FROM deployment_events WHERE deployment_id IN (` + placeholders(len(ids)) + `) GROUP BY deployment_id) AS m
  ON m.deployment_id = v.deployment_id
ORDER BY v.deployment_id, v.n`
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		if len(events) == 1 {
			return fmt.Errorf("store: record status %s of deployment %s: %w", events[0].status, events[0].id, err)
		}
		return fmt.Errorf("store: record %d history entries (first: status %s of deployment %s): %w", len(events), events[0].status, events[0].id, err)
	}
	return nil
}
