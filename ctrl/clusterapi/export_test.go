package clusterapi

// SetBeforeSnapshot makes every admitted bootstrap run f before its
// snapshot starts (tests hold a bootstrap in flight with it). Call before
// the server serves.
func SetBeforeSnapshot(s *Server, f func()) { s.beforeSnapshot = f }

// BootstrapsWaiting is how many bootstraps wait for a place.
func BootstrapsWaiting(s *Server) int64 { return s.bootstrapWaiting.Load() }
