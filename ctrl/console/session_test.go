package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// request carries the session cookie that rec received.
func request(rec *httptest.ResponseRecorder) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/fleet", nil)
	for _, c := range rec.Result().Cookies() {
		r.AddCookie(c)
	}
	return r
}

// TestSessionsLiveInTheStore: a session is found by its cookie through
// the store (by any replica: a second sessions on the same store), not
// by a forged, altered or missing cookie; it ends when it is signed out
// or expires; past the bound the oldest ends. The store holds no token in
// the clear.
func TestSessionsLiveInTheStore(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	one, two := newSessions(st, time.Hour, false), newSessions(st, time.Hour, false)
	get := func(ss *sessions, r *http.Request) *session {
		t.Helper()
		s, err := ss.get(r)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	rec := httptest.NewRecorder()
	const token = "krane_o_x_secret-part"
	if err := one.create(ctx, rec, token, "x"); err != nil {
		t.Fatal(err)
	}
	s := get(two, request(rec))
	if s == nil || s.token != token || s.tokenID != "x" || !two.alive(ctx, s) || s.csrf == "" {
		t.Fatalf("a new session is not found by its cookie on another replica: %+v", s)
	}
	if found, n, err := testenv.FindInDatabase(ctx, st.DB(), token, "secret-part"); err != nil || len(found) > 0 {
		t.Fatalf("the token in the clear in the database (%d rows searched): %v %v", n, found, err)
	}
	for name, value := range map[string]string{
		"none": "", "forged": randomToken(), "not base64": "!!!", "short": "AAAA",
		"altered": alter(cookieValue(t, rec)),
	} {
		r := httptest.NewRequest(http.MethodGet, "/fleet", nil)
		if value != "" {
			r.AddCookie(&http.Cookie{Name: sessionCookie, Value: value})
		}
		if get(one, r) != nil {
			t.Errorf("a request with a %s cookie has a session", name)
		}
	}

	// Expired (as the store's clock sees it).
	if _, err := st.DB().ExecContext(ctx, "UPDATE console_sessions SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	if get(one, request(rec)) != nil {
		t.Fatal("an expired session is found")
	}

	// Signed out on one replica: the other refuses the cookie.
	rec = httptest.NewRecorder()
	if err := one.create(ctx, rec, token, "x"); err != nil {
		t.Fatal(err)
	}
	s = get(two, request(rec))
	if err := one.end(ctx, httptest.NewRecorder(), get(one, request(rec))); err != nil {
		t.Fatal(err)
	}
	if get(two, request(rec)) != nil {
		t.Fatal("a session signed out on one replica is found on another")
	}
	two.forget(s) // as if sessionRecheck passed
	if two.alive(ctx, s) {
		t.Fatal("a live stream's session signed out elsewhere stays alive")
	}

	// Past the bound the oldest session ends.
	one.max = 5
	first := httptest.NewRecorder()
	if err := one.create(ctx, first, token, "first"); err != nil {
		t.Fatal(err)
	}
	for range one.max {
		time.Sleep(2 * time.Millisecond) // created_at has millisecond resolution
		if err := one.create(ctx, httptest.NewRecorder(), token, "y"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := one.count(ctx); err != nil || n != one.max {
		t.Fatalf("%d sessions kept (%v), want %d", n, err, one.max)
	}
	if get(one, request(first)) != nil {
		t.Fatal("the oldest session survived the bound")
	}
}

func cookieValue(t *testing.T, rec *httptest.ResponseRecorder) string {
	for _, c := range rec.Result().Cookies() {
		if c.Name == sessionCookie {
			return c.Value
		}
	}
	t.Fatal("no session cookie set")
	return ""
}

// alter flips one character of a cookie's value.
func alter(v string) string {
	b := []byte(v)
	if b[3] == 'A' {
		b[3] = 'B'
	} else {
		b[3] = 'A'
	}
	return string(b)
}

func TestWaveBarsAddUpToTheBar(t *testing.T) {
	st := &ctrlv1.RolloutStatus{Total: 10, Waves: []*ctrlv1.Wave{
		{Index: 1, Percentage: 10, Size: 1, Succeeded: 1, State: "completed"},
		{Index: 2, Percentage: 50, Size: 4, Succeeded: 2, Failed: 1, State: "in_progress"},
		{Index: 3, Percentage: 100, Size: 5, State: "pending"},
	}}
	bars := waveBars(st)
	want := []waveBar{{X: 0, W: 10, DoneW: 10}, {X: 10, W: 40, DoneW: 20, FailW: 10}, {X: 50, W: 50}}
	for i, b := range bars {
		if b.X != want[i].X || b.W != want[i].W || b.DoneW != want[i].DoneW || b.FailW != want[i].FailW {
			t.Errorf("wave %d: x %v w %v done %v fail %v; want %+v", i+1, b.X, b.W, b.DoneW, b.FailW, want[i])
		}
	}
	// No sentinels yet: the waves' percentage steps.
	st.Total = 0
	for _, w := range st.Waves {
		w.Size, w.Succeeded, w.Failed = 0, 0, 0
	}
	bars = waveBars(st)
	if bars[0].W != 10 || bars[1].W != 40 || bars[2].X != 50 || bars[2].W != 50 {
		t.Fatalf("empty rollout bars: %+v", bars)
	}
}

func TestFleetViewGroupsByRegionAndFlagsSilentClusters(t *testing.T) {
	now := time.Now()
	hb := func(ago time.Duration) *ctrlv1.ClusterInfo {
		return &ctrlv1.ClusterInfo{LastHeartbeatAt: timestamp(now.Add(-ago)), Live: ago <= actual.LiveWindow}
	}
	a1, a2, b1 := hb(10*time.Second), hb(5*time.Minute), &ctrlv1.ClusterInfo{}
	a1.Id, a1.Region = "a-1", "a"
	a2.Id, a2.Region = "a-2", "a"
	b1.Id, b1.Region = "b-1", "b"
	a1.Kinds = []*ctrlv1.KindProgress{{Kind: "deployment", Behind: true, ApplyErrors: 2}}
	p := fleetView([]*ctrlv1.ClusterInfo{a1, a2, b1}, now)
	if len(p.Regions) != 2 || len(p.Regions[0].Clusters) != 2 || p.Clusters != 3 || p.Silent != 2 || p.Behind != 1 {
		t.Fatalf("fleet view: %+v", p)
	}
	got := []string{p.Regions[0].Clusters[0].Heartbeat, p.Regions[0].Clusters[1].Heartbeat, p.Regions[1].Clusters[0].Heartbeat}
	if got[0] != "up" || got[1] != "silent" || got[2] != "never" {
		t.Fatalf("heartbeat states %v, want up, silent, never", got)
	}
	if c := p.Regions[0].Clusters[0]; !c.Behind || c.ApplyErrors != 2 {
		t.Fatalf("a-1: behind %v, apply errors %d", c.Behind, c.ApplyErrors)
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// TestLocalPathAcceptsOnlyThisConsolesPaths: what a browser would resolve
// to another origin (after dropping tabs and newlines, turning '\' into
// '/', or reading a scheme or a host) is refused.
func TestLocalPathAcceptsOnlyThisConsolesPaths(t *testing.T) {
	for _, p := range []string{"/fleet", "/sentinels?region=eu&page=x", "/deployments/d-1", "/a%2F%2Fb", "/.//x"} {
		if got := localPath(p, "/def"); got != p {
			t.Errorf("localPath(%q) = %q, want it kept", p, got)
		}
	}
	for _, p := range []string{
		"", "fleet", "//evil.example/", "https://evil.example/", "javascript:alert(1)",
		"/\t/evil.example/", "/\n/evil.example/", "/\r/evil.example/", "\t//evil.example/", "/\\evil.example/",
		"/x\\y", "/\x00/evil.example", "/\x7f", "/\u0085x", "///evil.example",
	} {
		if got := localPath(p, "/def"); got != "/def" {
			t.Errorf("localPath(%q) = %q, want it refused", p, got)
		}
	}
}
