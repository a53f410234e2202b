// Package restateendpoint is the Restate plumbing of ctrl: the HTTP
// endpoint Restate calls ctrl's durable handlers on (cleartext HTTP/2,
// answering only requests signed with one of restate.identity_keys when
// they are set), the request identity keys, and Register, which makes
// Restate's admin API route ctrl's services to that endpoint (again, with
// force, only when the handlers differ). The handlers themselves are in
// ctrl/workflows, and the client ctrl calls them with from outside
// Restate in ctrl/restateingress; ctrl serve and `ctrl restate register`
// wire them.
package restateendpoint
