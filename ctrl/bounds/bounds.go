// Package bounds enforces the bounds every request of ctrl's gRPC services
// declares on its proto (buf.validate annotations in proto/krane: lengths,
// counts, ranges, enums, patterns). One interceptor checks each request
// before any handler sees it and answers INVALID_ARGUMENT naming the field
// ("cursors[\"x\"]: value length must be at most 128 bytes"), also as a
// google.rpc.BadRequest detail listing the violations (the first 16). So a
// value past a bound never reaches the database (where it would fail as
// "data too long" and read as "unavailable, retry") nor a response that
// other callers read.
//
// The rules are protovalidate's (buf.build/go/protovalidate), the
// reference implementation of the annotations, so the proto is the one
// place a bound is declared: docs/operating.md's "Limits" table is
// generated from the same annotations and checked against them
// (TestLimitsTableIsCurrent). TestEveryRequestFieldIsBounded walks every
// request's fields from the descriptors and sends a value past each bound;
// a field without one fails it.
//
// A map field marked debug_redact (secret variables, credentials) is
// named without its key: a malformed key can be a value put in the wrong
// place. No violation message quotes a value.
package bounds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

var (
	once      sync.Once
	validator protovalidate.Validator
	initErr   error
)

// get is the process's validator: rules are compiled per message type on
// first use and cached (a fixed set: the types the protos declare).
func get() (protovalidate.Validator, error) {
	once.Do(func() { validator, initErr = protovalidate.New() })
	return validator, initErr
}

// Check validates msg against its declared bounds. A violation is
// INVALID_ARGUMENT naming the field, its path after prefix (e.g.
// "reports[3]" for one report of a batch, "status" for a status unpacked
// from an Any); nil when msg keeps every bound.
func Check(prefix string, msg proto.Message) error {
	v, err := get()
	if err != nil {
		return status.Errorf(codes.Internal, "the request validator could not start: %v", err)
	}
	err = v.Validate(msg)
	if err == nil {
		return nil
	}
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		// A rule that cannot be evaluated (a bug in an annotation).
		return status.Errorf(codes.Internal, "validating %s failed: %v", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return violationError(prefix, msg.ProtoReflect().Descriptor(), verr.Violations)
}

// maxDetails bounds the violations an answer lists, and maxPath the
// length of a field's path in it (a map key is part of the path): a
// request with many violations must not get an answer larger than its
// transport's header limits.
const (
	maxDetails = 16
	maxPath    = 256
)

// violationError is INVALID_ARGUMENT for violations: the first in the
// message, the first maxDetails as BadRequest field violations.
func violationError(prefix string, root protoreflect.MessageDescriptor, vs []*protovalidate.Violation) error {
	br := &errdetails.BadRequest{}
	for _, v := range vs[:min(len(vs), maxDetails)] {
		field := join(prefix, fieldPath(root, v.Proto.GetField()))
		if len(field) > maxPath {
			field = strings.ToValidUTF8(field[:maxPath], "") + "…"
		}
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: field, Description: reason(v)})
	}
	first := br.FieldViolations[0]
	msg := first.Field + ": " + first.Description
	if first.Field == "" {
		msg = first.Description
	}
	if n := len(vs) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more)", n)
	}
	st := status.New(codes.InvalidArgument, msg)
	if d, err := st.WithDetails(br); err == nil {
		st = d
	}
	return st.Err()
}

func join(prefix, path string) string {
	switch {
	case prefix == "":
		return path
	case path == "" || strings.HasPrefix(path, "["):
		return prefix + path
	}
	return prefix + "." + path
}

// reason is a violation's sentence, with the rule's id when it has no
// message of its own.
func reason(v *protovalidate.Violation) string {
	if m := v.Proto.GetMessage(); m != "" {
		return m
	}
	return "breaks rule " + v.Proto.GetRuleId()
}

// fieldPath renders a violation's path as protovalidate does
// ("a.b[2].c[\"key\"]"), except that the key of a map marked
// debug_redact is "[…]". root is the message the path starts at.
func fieldPath(root protoreflect.MessageDescriptor, p *validate.FieldPath) string {
	var b strings.Builder
	md := root
	for i, e := range p.GetElements() {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.GetFieldName())
		var fd protoreflect.FieldDescriptor
		if md != nil {
			fd = md.Fields().ByNumber(protoreflect.FieldNumber(e.GetFieldNumber()))
		}
		switch s := e.GetSubscript().(type) {
		case *validate.FieldPathElement_Index:
			fmt.Fprintf(&b, "[%d]", s.Index)
		case *validate.FieldPathElement_BoolKey:
			fmt.Fprintf(&b, "[%t]", s.BoolKey)
		case *validate.FieldPathElement_IntKey:
			fmt.Fprintf(&b, "[%d]", s.IntKey)
		case *validate.FieldPathElement_UintKey:
			fmt.Fprintf(&b, "[%d]", s.UintKey)
		case *validate.FieldPathElement_StringKey:
			if redacted(fd) {
				b.WriteString("[…]")
			} else {
				fmt.Fprintf(&b, "[%q]", s.StringKey)
			}
		}
		md = nil
		switch {
		case fd == nil:
		case fd.IsMap():
			md = fd.MapValue().Message()
		default:
			md = fd.Message()
		}
	}
	return b.String()
}

// redacted reports whether fd is marked debug_redact (secret variables,
// credentials): its map keys are never shown.
func redacted(fd protoreflect.FieldDescriptor) bool {
	if fd == nil {
		return true // unknown: show nothing of it
	}
	o, ok := fd.Options().(*descriptorpb.FieldOptions)
	return ok && o.GetDebugRedact()
}

// Refused counts the requests refused past a bound, by method: a rise
// after an upgrade means callers (an older CLI or host) send what a new
// bound refuses. Register it with the server's registry.
var Refused = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "krane_ctrl_requests_out_of_bounds_total",
	Help: "Requests refused with INVALID_ARGUMENT because a field was past its declared bound (docs/operating.md, Limits), by method.",
}, []string{"method"})

// UnaryInterceptor checks every unary request before its handler runs.
func UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok {
			if err := Check("", m); err != nil {
				Refused.WithLabelValues(info.FullMethod).Inc()
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor checks every message a client sends on a stream (for
// ctrl's server streams: the one request) as the handler receives it.
func StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, checkedStream{ServerStream: ss, method: info.FullMethod})
	}
}

type checkedStream struct {
	grpc.ServerStream
	method string
}

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		if err := Check("", pm); err != nil {
			Refused.WithLabelValues(s.method).Inc()
			return err
		}
	}
	return nil
}
