// Package restateingress is ctrl's signed client of Restate's ingress:
// how ctrl calls its own durable handlers (ctrl/workflows) from outside
// Restate, from the operators' APIs, the background loops and the tools.
// Every call goes through CtrlIngress.Call, the one handler the ingress
// may reach, signed with the key every ctrl replica shares through the
// database (see workflows.GatewayName); reading an invocation's result
// attaches to it on the ingress directly. The endpoint Restate calls the
// handlers on, and their registration, are in ctrl/restateendpoint.
package restateingress
