package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FieldError is input a caller got wrong: which field (as the API names
// it) and why. Status answers it as INVALID_ARGUMENT naming the field, with
// a google.rpc.BadRequest detail.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// GRPCStatus is INVALID_ARGUMENT naming the field, with a
// google.rpc.BadRequest detail: a FieldError returned from anywhere in a
// handler (also wrapped) answers the call as such.
func (e *FieldError) GRPCStatus() *status.Status {
	st := status.New(codes.InvalidArgument, e.Error())
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: e.Field, Description: e.Reason}}}); err == nil {
		return d
	}
	return st
}

// Fieldf is a FieldError with a formatted reason.
func Fieldf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ErrNotFound is what a read of a missing object returns (the store's
// ErrNotFound is this error). Status answers it as NOT_FOUND.
var ErrNotFound = errors.New("not found")

// Refused is implemented by errors that refuse a request for what it asks
// (not for how it is formed), such as the store's RefusedError. Status
// answers them as INVALID_ARGUMENT with their message.
type Refused interface {
	error
	Refused()
}

// Status is the one mapping of ctrl's errors to gRPC statuses:
//
//   - a *FieldError is INVALID_ARGUMENT naming the field (and a BadRequest
//     detail: see FieldError.GRPCStatus);
//   - a status (a handler's deliberate answer) passes unchanged;
//   - the caller's own cancellation or deadline is answered as such;
//   - a Refused error is INVALID_ARGUMENT;
//   - ErrNotFound (wrapped with what was not found) is NOT_FOUND;
//   - anything else is a failure of ctrl's database (or of what the
//     handler called): UNAVAILABLE, saying to retry.
func Status(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.GRPCStatus().Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	var refused Refused
	if errors.As(err, &refused) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if errors.Is(err, ErrNotFound) {
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Errorf(codes.Unavailable, "%v: ctrl's database is unavailable; retry", err)
}

// UnaryInterceptor answers every error a handler returns through Status,
// logging those that become UNAVAILABLE (a failure of ctrl, not of the
// caller).
func UnaryInterceptor(log hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			err = mapped(ctx, log, info.FullMethod, err)
		}
		return resp, err
	}
}

// StreamInterceptor is UnaryInterceptor for streams.
func StreamInterceptor(log hclog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		if err != nil {
			err = mapped(ss.Context(), log, info.FullMethod, err)
		}
		return err
	}
}

func mapped(ctx context.Context, log hclog.Logger, method string, err error) error {
	st := Status(ctx, err)
	if status.Code(st) == codes.Unavailable && log != nil {
		log.Error("call failed", "method", method, "error", err)
	}
	return st
}
