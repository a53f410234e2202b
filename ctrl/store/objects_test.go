package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

const quota = "quota.acme.example"

func putObject(t *testing.T, s *store.Store, kind, id, spec string, regions ...string) ([]store.RegionChange, map[string]uint64) {
	t.Helper()
	var plan []store.RegionChange
	stamped, err := s.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		var err error
		plan, err = tx.PutObject(ctx, kind, id, []byte(spec), regions)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]uint64{}
	for _, st := range stamped {
		versions[st.Region] = st.Version
	}
	return plan, versions
}

func changes(plan []store.RegionChange) map[string]string {
	out := map[string]string{}
	for _, c := range plan {
		out[c.Region] = c.What
	}
	return out
}

// TestPutObjectVersionsOnlyWhatChanged: a put is one versioned write per
// region whose content changes; putting the same object again (keys in
// another order) makes no version; dropping a region soft-deletes it there.
func TestPutObjectVersionsOnlyWhatChanged(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	plan, v1 := putObject(t, s, quota, "team-a", `{"cpu":"2","pods":10}`, "eu", "us")
	if got := changes(plan); got["eu"] != "create" || got["us"] != "create" || len(v1) != 2 {
		t.Fatalf("first put: %v, versions %v", got, v1)
	}
	plan, v2 := putObject(t, s, quota, "team-a", `{ "pods": 10, "cpu": "2" }`, "us", "eu")
	if got := changes(plan); got["eu"] != "unchanged" || got["us"] != "unchanged" || len(v2) != 0 {
		t.Errorf("same object again: %v, versions %v; want unchanged, no version", got, v2)
	}
	plan, v3 := putObject(t, s, quota, "team-a", `{"cpu":"4","pods":10}`, "eu")
	if got := changes(plan); got["eu"] != "update" || got["us"] != "delete" || v3["eu"] <= v1["us"] || v3["us"] <= v1["us"] {
		t.Errorf("new spec in eu only: %v, versions %v", got, v3)
	}
	// What the clusters of each region stream.
	eu, err := s.ChangesAfter(ctx, quota, "eu", v1["eu"], 10)
	if err != nil || len(eu) != 1 || eu[0].Version != v3["eu"] || eu[0].Deleted {
		t.Errorf("eu streams %+v, %v", eu, err)
	}
	us, err := s.ChangesAfter(ctx, quota, "us", v1["us"], 10)
	if err != nil || len(us) != 1 || !us[0].Deleted || us[0].Version != v3["us"] {
		t.Errorf("us streams %+v, %v", us, err)
	}
	o, err := s.GetObject(ctx, quota, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if string(o.Spec()) != `{"cpu":"4","pods":10}` || !o.Live() || len(o.Regions) != 2 {
		t.Errorf("object: spec %s live %v regions %+v", o.Spec(), o.Live(), o.Regions)
	}
	// Back in us: undeleted with the current spec.
	plan, _ = putObject(t, s, quota, "team-a", `{"cpu":"4","pods":10}`, "eu", "us")
	if got := changes(plan); got["us"] != "undelete" || got["eu"] != "unchanged" {
		t.Errorf("back in us: %v", got)
	}
}

func TestDeleteObject(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	_, v := putObject(t, s, quota, "gone", `{"cpu":"1"}`, "eu", "us")
	del := func(regions ...string) (map[string]string, []store.Stamped, error) {
		var plan []store.RegionChange
		st, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			var err error
			plan, err = tx.DeleteObject(ctx, quota, "gone", regions)
			return err
		})
		return changes(plan), st, err
	}
	got, st, err := del("us")
	if err != nil || got["us"] != "delete" || len(got) != 1 || len(st) != 1 || st[0].Version <= v["us"] {
		t.Errorf("delete in us: %v %v %v", got, st, err)
	}
	got, st, err = del()
	if err != nil || got["eu"] != "delete" || got["us"] != "unchanged" || len(st) != 1 {
		t.Errorf("delete everywhere: %v %v %v", got, st, err)
	}
	o, err := s.GetObject(ctx, quota, "gone")
	if err != nil || o.Live() {
		t.Errorf("after delete: live %v, %v", o.Live(), err)
	}
	if _, _, err := del(); err != nil {
		t.Errorf("deleting again: %v", err)
	}
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.DeleteObject(ctx, quota, "never", nil)
		return err
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete of an object that never existed: %v, want ErrNotFound", err)
	}
}

// TestCiliumPolicyObject: the resource API's ciliumnetworkpolicy writes
// the policy table (what the cilium plugin streams), in one region only.
func TestCiliumPolicyObject(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	spec := `{"namespace":"team-a","name":"allow-web","policy":{"endpointSelector":{}}}`
	_, v := putObject(t, s, kinds.CiliumNetworkPolicy, "pol-1", spec, "eu")
	c, err := s.Desired(ctx, kinds.CiliumNetworkPolicy, "eu", "pol-1")
	if err != nil || c.Version != v["eu"] {
		t.Fatalf("desired: %+v %v", c, err)
	}
	p := c.Spec.(*clusterv1.CiliumNetworkPolicy)
	if p.GetK8SNamespace() != "team-a" || p.GetK8SName() != "allow-web" || string(p.GetPolicy()) == "" {
		t.Errorf("policy row: %+v", p)
	}
	var refused *store.RefusedError
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.PutObject(ctx, kinds.CiliumNetworkPolicy, "pol-1", []byte(spec), []string{"eu", "us"})
		return err
	})
	if !errors.As(err, &refused) {
		t.Errorf("two regions: %v, want refused", err)
	}
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.PutObject(ctx, kinds.CiliumNetworkPolicy, "pol-1", []byte(spec), []string{"us"})
		return err
	})
	if !errors.As(err, &refused) {
		t.Errorf("moving region: %v, want refused", err)
	}
	o, err := s.GetObject(ctx, kinds.CiliumNetworkPolicy, "pol-1")
	if err != nil || string(o.Spec()) != spec {
		t.Errorf("object: %s, %v", o.Spec(), err)
	}
}

func TestObjectStatusAndErrors(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	liveClusters(t, s, "eu", "eu-1")
	_, v := putObject(t, s, quota, "st", `{"cpu":"1"}`, "eu")
	if _, err := s.ReportResource(ctx, quota, "eu", "eu-1", "st", store.Observation{Version: v["eu"]}, []byte(`{"used":"0"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.ReportApplyError(ctx, quota, "eu", "eu-1", "st", &clusterv1.ApplyError{Version: v["eu"], Message: "cpu: not a quantity", Field: "cpu", Permanent: true}, v["eu"]); err != nil {
		t.Fatal(err)
	}
	o, err := s.GetObject(ctx, quota, "st")
	if err != nil {
		t.Fatal(err)
	}
	r := o.Regions[0]
	if r.ObservedVersion != v["eu"] || string(r.Status) != `{"used":"0"}` || len(r.Errors) != 1 || r.Errors[0].Field != "cpu" || !r.Errors[0].Permanent {
		t.Errorf("region: %+v", r)
	}
}

func TestListObjectsPages(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	for i := range 7 {
		putObject(t, s, quota, fmt.Sprintf("o%d", i), `{}`, "eu")
	}
	putObject(t, s, quota, "only-us", `{}`, "us")
	putObject(t, s, "other.acme.example", "o9", `{}`, "eu")
	var ids []string
	after := ""
	for {
		page, err := s.ListObjects(ctx, store.ObjectFilter{Kind: quota, Region: "eu"}, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			ids = append(ids, o.ID)
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].ID
	}
	if fmt.Sprint(ids) != "[o0 o1 o2 o3 o4 o5 o6]" {
		t.Errorf("pages: %v", ids)
	}
	// A deleted object is listed only when asked for.
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.DeleteObject(ctx, quota, "o3", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	live, _ := s.ListObjects(ctx, store.ObjectFilter{Kind: quota}, "", 100)
	all, _ := s.ListObjects(ctx, store.ObjectFilter{Kind: quota, IncludeDeleted: true}, "", 100)
	if len(live) != 7 || len(all) != 8 {
		t.Errorf("live %d (want 7), all %d (want 8)", len(live), len(all))
	}
}

func TestRegisterKind(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	created, err := s.RegisterKind(ctx, store.KindRegistration{Kind: quota, SpecSchema: `{"type":"object"}`})
	if err != nil || !created {
		t.Fatalf("register: %v %v", created, err)
	}
	created, err = s.RegisterKind(ctx, store.KindRegistration{Kind: quota, SpecSchema: `{"type":"object","required":["cpu"]}`, Description: "quotas"})
	if err != nil || created {
		t.Fatalf("register again: %v %v", created, err)
	}
	k, err := s.GetKind(ctx, quota)
	if err != nil || k.Description != "quotas" {
		t.Errorf("kind: %+v %v", k, err)
	}
	if _, err := s.GetKind(ctx, "nope.example"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unregistered: %v", err)
	}
	if _, err := s.RegisterKind(ctx, store.KindRegistration{Kind: kinds.Deployment, SpecSchema: `{}`}); err == nil {
		t.Error("a built-in kind was registered")
	}
}

// TestConcurrentPutsKeepTheNewestVersion: writers put the same few objects
// concurrently (random specs and region sets; first puts of a new object
// may deadlock and are retried by WriteTx); every region's row ends up
// with the content of the put that gave it its highest version, and the
// watch of each region streams it at that version. KRANE_OBJECTS_SEED
// replays a run.
func TestConcurrentPutsKeepTheNewestVersion(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("KRANE_OBJECTS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (replay with KRANE_OBJECTS_SEED=%d)", seed, seed)
	s := openStore(t)
	ctx := context.Background()
	regions := []string{"eu", "us", "ap"}
	type put struct {
		spec     string
		versions map[string]uint64
		deleted  map[string]bool
	}
	var mu sync.Mutex
	puts := map[string][]put{} // object id -> successful puts
	var wg sync.WaitGroup
	for w := range 4 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := range 15 {
				id := fmt.Sprintf("o%d", r.IntN(3))
				var in []string
				for _, reg := range regions {
					if r.IntN(2) == 0 {
						in = append(in, reg)
					}
				}
				if len(in) == 0 {
					in = regions[:1]
				}
				spec := fmt.Sprintf(`{"i":%d,"writer":%d}`, i, w) // canonical: keys sorted
				var plan []store.RegionChange
				stamped, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
					var err error
					plan, err = tx.PutObject(ctx, quota, id, []byte(spec), in)
					return err
				})
				if err != nil {
					t.Errorf("put %s: %v", id, err)
					return
				}
				p := put{spec: spec, versions: map[string]uint64{}, deleted: map[string]bool{}}
				for _, st := range stamped {
					p.versions[st.Region] = st.Version
				}
				for _, c := range plan {
					p.deleted[c.Region] = c.What == "delete"
				}
				mu.Lock()
				puts[id] = append(puts[id], p)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for id, ps := range puts {
		o, err := s.GetObject(ctx, quota, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range o.Regions {
			var newest *put
			for i := range ps {
				if v := ps[i].versions[row.Region]; v > 0 && (newest == nil || v > newest.versions[row.Region]) {
					newest = &ps[i]
				}
			}
			if newest == nil {
				t.Errorf("%s in %s: a row no put versioned", id, row.Region)
				continue
			}
			if row.Version != newest.versions[row.Region] || row.Deleted != newest.deleted[row.Region] ||
				!row.Deleted && string(row.Spec) != newest.spec {
				t.Errorf("%s in %s: row v%d deleted=%v %s; the newest put gave v%d deleted=%v %s (seed %d)", id, row.Region,
					row.Version, row.Deleted, row.Spec, newest.versions[row.Region], newest.deleted[row.Region], newest.spec, seed)
			}
			changes, err := s.ChangesAfter(ctx, quota, row.Region, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range changes {
				if c.ID == id && c.Version != row.Version {
					t.Errorf("%s in %s streams v%d, the row has v%d", id, row.Region, c.Version, row.Version)
				}
			}
		}
	}
}
