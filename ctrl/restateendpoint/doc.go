// Package restateendpoint is the Restate plumbing of ctrl: the HTTP
// endpoint Restate calls ctrl's durable handlers on (cleartext HTTP/2,
// answering only requests signed with one of restate.identity_keys when
// they are set), the request identity keys, and the deployments of ctrl's
// lines (versions.go): each minor line of ctrl serves its handlers under
// a path of its own (/v0.2) and is a Restate deployment of its own, so an
// invocation always finishes on the code that started it. Register makes
// Restate's admin API route ctrl's services to this line's deployment
// (again, with force, only when the handlers differ or an older line took
// them); Deployments and RemoveDrained let an operator see and remove the
// deployments of older lines once nothing runs on them. The handlers
// themselves are in ctrl/workflows, and the client ctrl calls them with
// from outside Restate in ctrl/restateingress; ctrl serve and `ctrl
// restate` wire them.
package restateendpoint
