// Package api is what every gRPC service of ctrl shares at its boundary:
//
//   - FieldError, the one type for input a caller got wrong (the field as
//     the API names it, and why);
//   - Status and the interceptors that apply it: the one mapping from the
//     errors handlers return (store errors, FieldErrors, the caller's own
//     cancellation) to gRPC statuses, so a handler returns its error with
//     context and never builds a status for these itself;
//   - paging: the page size, the opaque page token (one codec) and the cut
//     of a page, for every list API.
//
// It imports no other package of ctrl, so the domain packages and the
// store can use its types.
package api
