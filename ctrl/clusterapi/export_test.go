package clusterapi

// SetBeforeSnapshot makes every admitted bootstrap run f before its
// snapshot starts (tests hold a bootstrap in flight with it). Call before
// the server serves.
func SetBeforeSnapshot(s *Server, f func()) { s.beforeSnapshot = f }
