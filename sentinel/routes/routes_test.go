package routes

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	r, err := Parse([]byte(`{"sentinel_id":"sen_a","environment_id":"env_a","version":3,"hosts":["App.Example.com"],
		"backend":{"deployment_id":"dep_a","namespace":"ns","service":"dep-a","port":8080}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Hosts[0] != "app.example.com" || r.Backend.Service != "dep-a" || r.Version != 3 {
		t.Fatalf("parsed %+v", r)
	}
	if r, err := Parse([]byte(`{"environment_id":"env_a","version":1,"hosts":[]}`)); err != nil || r.Backend != nil {
		t.Fatalf("no backend: %+v %v", r, err)
	}
	// A field added by a newer sentinel plugin does not stop an older
	// sentinel from routing.
	if r, err := Parse([]byte(`{"environment_id":"env_a","hosts":["a.example.com"],"weights":{"dep_b":10},"backend":{"deployment_id":"d","namespace":"n","service":"s","port":80,"zone":"z"}}`)); err != nil || r.Backend == nil || r.Hosts[0] != "a.example.com" {
		t.Fatalf("a document with fields this release does not know: %+v %v", r, err)
	}
	for doc, want := range map[string]string{
		`{"environment_id":"env_a","hosts":["a.example.com:80"]}`: "not a DNS name",
		`{"environment_id":"env_a","hosts":["a.com","A.com"]}`:    "listed twice",
		`{"hosts":[]}`: "environment_id is empty",
		`{"environment_id":"e","backend":{"deployment_id":"d"}}`:                                            "needs namespace and service",
		`{"environment_id":"e","backend":{"deployment_id":"d","namespace":"n","service":"s","port":70000}}`: "outside 0-65535",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %q", doc, err, want)
		}
	}
}
