package store_test

import (
	"context"
	"errors"
	"testing"

	"krane.dev/ctrl/store"
)

// A cursor is only believed within the history of versions that gave it:
// one ahead of the head (the database went back in time: restored, failed
// over to a replica that lagged) or of another generation is refused, and
// finding one ahead gives the database a new generation, once.
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
		if g, err := s.CheckCursor(ctx, tc.after, tc.gen); err != nil || g != g0 {
			t.Errorf("CheckCursor(%d, %q) = %q, %v; want %q", tc.after, tc.gen, g, err, g0)
		}
	}

	// Ahead of the head: refused, and the database gets a new generation.
	g1, err := s.CheckCursor(ctx, head+5, g0)
	var ce *store.CursorError
	if !errors.As(err, &ce) || !ce.Detected || g1 == g0 || ce.Current != g1 {
		t.Fatalf("a cursor ahead of the head: %q, %v; want a CursorError with a new generation", g1, err)
	}
	if g, _ := s.Generation(ctx); g != g1 {
		t.Fatalf("generation %q after the detection, want %q", g, g1)
	}
	// Another host's cursor of the old generation, at or below the head:
	// refused too, without a new generation each time.
	g2, err := s.CheckCursor(ctx, head-1, g0)
	if !errors.As(err, &ce) || ce.Detected || g2 != g1 {
		t.Fatalf("a cursor of the old generation: %q, %v; want a CursorError naming %q", g2, err, g1)
	}
	if g, err := s.CheckCursor(ctx, head, g1); err != nil || g != g1 {
		t.Fatalf("a cursor of the current generation: %q, %v", g, err)
	}

	// `ctrl admin db restored`: a new generation refuses every cursor held.
	g3, err := s.NewGeneration(ctx, "restored from a test backup")
	if err != nil || g3 == g1 {
		t.Fatalf("NewGeneration: %q, %v", g3, err)
	}
	if _, err := s.CheckCursor(ctx, head, g1); !errors.As(err, &ce) {
		t.Fatalf("a cursor of the generation before `ctrl admin db restored`: %v; want refused", err)
	}
}
