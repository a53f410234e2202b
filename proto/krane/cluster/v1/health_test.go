package clusterv1

import "testing"

// Every view names a health with Word; a value from a newer host that this
// release does not know reads "unknown", not its number.
func TestHealthWord(t *testing.T) {
	for h, want := range map[Health]string{
		Health_HEALTH_UNSPECIFIED: "unknown",
		Health_HEALTH_HEALTHY:     "healthy",
		Health_HEALTH_UNHEALTHY:   "unhealthy",
		Health_HEALTH_PAUSED:      "paused",
		Health(99):                "unknown",
	} {
		if got := h.Word(); got != want {
			t.Errorf("%v.Word() = %q, want %q", h, got, want)
		}
	}
}
