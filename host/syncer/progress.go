package syncer

// Parked is how many changes the loop's current session holds parked
// (failed permanently, retried rarely); 0 before the first session. The
// host reports it to ctrl in its heartbeats.
func (l *Loop) Parked() int {
	l.mu.Lock()
	q := l.q
	l.mu.Unlock()
	if q == nil {
		return 0
	}
	return q.Parked()
}
