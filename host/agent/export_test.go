package agent

import "time"

// SetHeartbeatInterval changes the heartbeat interval for agents started
// afterwards; the returned func restores it (call it after they stopped).
func SetHeartbeatInterval(d time.Duration) (restore func()) {
	was := heartbeatInterval
	heartbeatInterval = d
	return func() { heartbeatInterval = was }
}

// KickHeartbeat sends a heartbeat now.
func (a *Agent) KickHeartbeat() { a.kickHeartbeat() }
