package store

// QueuedWrites is how many WriteTx calls wait for a group commit (tests
// use it to build a batch of a known size).
func (s *Store) QueuedWrites() int {
	if s.writes == nil {
		return 0
	}
	s.writes.mu.Lock()
	defer s.writes.mu.Unlock()
	return len(s.writes.queue)
}
