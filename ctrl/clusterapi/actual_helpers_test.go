package clusterapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"krane.dev/ctrl/store"
)

// clusterReport is one cluster's stored report on an object, as
// "v<version> <status JSON>" ("none" without one).
func clusterReport(t testing.TB, s *store.Store, kind, region, id, cluster string) string {
	t.Helper()
	reps, err := s.ObjectReports(context.Background(), kind, region, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if r.ClusterID == cluster {
			out := fmt.Sprintf("v%d %s", r.Version, r.Status)
			if r.Deleted {
				out += " deleted"
			}
			return strings.TrimSpace(out)
		}
	}
	return "none"
}
