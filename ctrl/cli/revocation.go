package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/store"
)

// replicaSilentAfter: a replica that has not recorded a read of the
// revoked tokens for this long cannot read the database (or stopped), and
// so trusts no token past its cache time (auth.cache_ttl, at most 2 s).
const replicaSilentAfter = 5 * time.Second

// waitRevocationsRead waits until every ctrl replica reading the database
// has read the revocations committed before now: each then refuses the
// revoked tokens and has closed their streams. It says so on standard
// error, and fails, naming the replicas, when some did not within wait.
func waitRevocationsRead(cmd *cobra.Command, st *store.Store, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), wait)
	defer cancel()
	committed, err := st.Now(ctx)
	if err != nil {
		return fmt.Errorf("revoked, but cannot check that every ctrl replica refuses it: %w", err)
	}
	for {
		replicas, now, err := st.Replicas(ctx)
		if err != nil {
			return fmt.Errorf("revoked, but cannot check that every ctrl replica refuses it: %w", err)
		}
		var pending, confirmed []string
		for _, r := range replicas {
			switch {
			case now.Sub(r.SeenAt) > replicaSilentAfter:
				// Silent: it cannot read the database, and so refuses
				// every token whose cache time ran out.
			case r.RevocationsReadAt.Before(committed):
				pending = append(pending, fmt.Sprintf("%s (%s, last read %s before the revocation)", r.ID[:8], r.Version, committed.Sub(r.RevocationsReadAt).Round(time.Millisecond)))
			default:
				confirmed = append(confirmed, r.ID[:8])
			}
		}
		if len(pending) == 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "Every ctrl replica reading the database (%d) refuses it now and has closed its open streams.\n", len(confirmed))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("revoked, but %d ctrl replica(s) have not read the revocation within %s: %s; they refuse it once they read the database again (auth.revocation_poll_interval): check their logs",
				len(pending), wait, strings.Join(pending, ", "))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
