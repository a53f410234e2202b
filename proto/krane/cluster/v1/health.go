package clusterv1

// Word is the health as every view of ctrl names it (the store's sentinel
// rows, the CLI, the console, the rules' messages): "healthy",
// "unhealthy", "paused", or "unknown" for HEALTH_UNSPECIFIED and for a
// value a newer host sends that this release does not know. One spelling,
// so an operator reading the CLI, the console and a deploy's message sees
// the same word.
func (h Health) Word() string {
	switch h {
	case Health_HEALTH_HEALTHY:
		return "healthy"
	case Health_HEALTH_UNHEALTHY:
		return "unhealthy"
	case Health_HEALTH_PAUSED:
		return "paused"
	}
	return "unknown"
}
