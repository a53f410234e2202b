package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"krane.dev/ctrl/store"
)

// A cursor is only believed within the history of versions that gave it:
// one ahead of the head (the database went back in time: restored, failed
// over to a replica that lagged) or of another generation is refused. The
// generation changes on the operator's word, or when the claims of
// store.ClaimQuorum clusters agree, at most once per store.ClaimWindow: no
// single cluster moves the fleet.
func TestCursorFromAnotherHistoryIsRefused(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	g0, err := s.Generation(ctx)
	if err != nil || len(g0) != 32 {
		t.Fatalf("generation after migrate: %q, %v; want 32 hex digits", g0, err)
	}
	var head uint64
	for _, id := range []string{"a", "b", "c"} {
		st, err := s.WriteTx(ctx, putResource(id, "1"))
		if err != nil {
			t.Fatal(err)
		}
		head = st[0].Version
	}
	for _, tc := range []struct {
		after uint64
		gen   string
	}{{0, ""}, {0, "someone-else"}, {head, g0}, {head - 1, g0}, {head, ""}} {
		if g, err := s.CheckCursor(ctx, "eu-1", "eu", tc.after, tc.gen); err != nil || g != g0 {
			t.Errorf("CheckCursor(%d, %q) = %q, %v; want %q", tc.after, tc.gen, g, err, g0)
		}
	}
	ageGeneration(t, s)

	// One cluster's cursor ahead of the head, however often: refused, and
	// the generation stays.
	var ce *store.CursorError
	for i := range 5 {
		g, err := s.CheckCursor(ctx, "eu-1", "eu", head+5+uint64(i), g0)
		if !errors.As(err, &ce) || ce.Detected || g != g0 {
			t.Fatalf("claim %d of one cluster: %q, %v; want refused, generation %s kept", i, g, err, g0)
		}
	}
	// A second cluster's agreeing claim: the database takes a new
	// generation, once.
	g1, err := s.CheckCursor(ctx, "us-1", "us", head+2, g0)
	if !errors.As(err, &ce) || !ce.Detected || g1 == g0 || ce.Current != g1 {
		t.Fatalf("the second cluster's claim: %q, %v; want a CursorError with a new generation", g1, err)
	}
	if g, _ := s.Generation(ctx); g != g1 {
		t.Fatalf("generation %q after the detection, want %q", g, g1)
	}
	claims, err := s.CursorClaims(ctx)
	if err != nil || len(claims) != 2 || claims[0].ClusterID == claims[1].ClusterID {
		t.Fatalf("claims %+v, %v; want one per cluster", claims, err)
	}
	// Within the window, more claims (of the new generation) change
	// nothing.
	for _, c := range []string{"eu-1", "us-1", "ap-1"} {
		if g, err := s.CheckCursor(ctx, c, "x", head+9, g1); !errors.As(err, &ce) || ce.Detected || g != g1 {
			t.Fatalf("a claim within the window: %q, %v", g, err)
		}
	}
	// Another host's cursor of the old generation, at or below the head:
	// refused too, without a new generation.
	g2, err := s.CheckCursor(ctx, "ap-1", "ap", head-1, g0)
	if !errors.As(err, &ce) || ce.Detected || g2 != g1 {
		t.Fatalf("a cursor of the old generation: %q, %v; want a CursorError naming %q", g2, err, g1)
	}
	if g, err := s.CheckCursor(ctx, "ap-1", "ap", head, g1); err != nil || g != g1 {
		t.Fatalf("a cursor of the current generation: %q, %v", g, err)
	}

	// `ctrl admin db restored`: a new generation refuses every cursor held.
	g3, err := s.NewGeneration(ctx, "restored from a test backup")
	if err != nil || g3 == g1 {
		t.Fatalf("NewGeneration: %q, %v", g3, err)
	}
	if _, err := s.CheckCursor(ctx, "ap-1", "ap", head, g1); !errors.As(err, &ce) {
		t.Fatalf("a cursor of the generation before `ctrl admin db restored`: %v; want refused", err)
	}
}

// ageGeneration makes the database's generation older than the claim
// window, as one that has not changed for a while.
func ageGeneration(t *testing.T, s *store.Store) {
	t.Helper()
	if _, err := s.DB().ExecContext(context.Background(), "UPDATE db_generation SET updated_at = updated_at - ?", (store.ClaimWindow + time.Minute).Milliseconds()); err != nil {
		t.Fatal(err)
	}
}
