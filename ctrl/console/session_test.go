package console

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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

func TestSessionsExpireAndStayBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ss := newSessions(time.Hour, false)
	ss.now = func() time.Time { return now }

	rec := httptest.NewRecorder()
	s := ss.create(rec, "krane_o_x", "x")
	if got := ss.get(request(rec)); got != s || !ss.alive(s) {
		t.Fatal("a new session is not found by its cookie")
	}
	if ss.get(httptest.NewRequest(http.MethodGet, "/", nil)) != nil {
		t.Fatal("a request without a cookie has a session")
	}
	now = now.Add(time.Hour)
	if ss.get(request(rec)) != nil || ss.alive(s) {
		t.Fatal("a session outlived its TTL")
	}

	// Past maxSessions the oldest session ends.
	first := httptest.NewRecorder()
	ss.create(first, "krane_o_first", "first")
	for i := 0; i < maxSessions; i++ {
		now = now.Add(time.Millisecond)
		ss.create(httptest.NewRecorder(), "krane_o_y", "y")
	}
	if n := ss.count(); n != maxSessions {
		t.Fatalf("%d sessions held, want at most %d", n, maxSessions)
	}
	if ss.get(request(first)) != nil {
		t.Fatal("the oldest session survived the bound")
	}
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
		return &ctrlv1.ClusterInfo{LastHeartbeatAt: timestamp(now.Add(-ago))}
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
