// Package e2e holds the end-to-end tests: the real krane host and its
// plugins against the real ctrl, MySQL, Restate and simulated clusters.
package e2e
