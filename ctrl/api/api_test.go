package api_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/api"
)

type refused struct{}

func (refused) Error() string { return "environment e1 has a deploy in progress" }
func (refused) Refused()      {}

// TestStatusMapsEachErrorOnce: the one mapping answers each kind of error
// a handler returns with its code, keeps the handler's context in the
// message, and names the field of a FieldError in a BadRequest detail.
func TestStatusMapsEachErrorOnce(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		code codes.Code
		msg  string
	}{
		{"field", ctx, fmt.Errorf("checking the spec: %w", api.Fieldf("replicas", "%d is out of range", -1)), codes.InvalidArgument, "replicas: -1 is out of range"},
		{"status passes", ctx, status.Error(codes.FailedPrecondition, "not now"), codes.FailedPrecondition, "not now"},
		{"not found", ctx, fmt.Errorf("deployment dep_1: %w", api.ErrNotFound), codes.NotFound, "deployment dep_1: not found"},
		{"refused", ctx, fmt.Errorf("rollback: %w", refused{}), codes.InvalidArgument, "rollback: environment e1 has a deploy in progress"},
		{"database", ctx, fmt.Errorf("listing deployments failed: %w", errors.New("connection refused")), codes.Unavailable, "listing deployments failed: connection refused: ctrl's database is unavailable; retry"},
		{"caller went away", cancelled, errors.New("read: context canceled"), codes.Canceled, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(api.Status(tc.ctx, tc.err))
			if st.Code() != tc.code || (tc.msg != "" && st.Message() != tc.msg) {
				t.Fatalf("Status(%v) = %s %q, want %s %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	st := status.Convert(api.Status(ctx, api.Fieldf("image", "required")))
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		if b, ok := d.(*errdetails.BadRequest); ok {
			br = b
		}
	}
	if br == nil || len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != "image" {
		t.Fatalf("a FieldError's status carries no BadRequest naming the field: %v", st.Details())
	}
	if api.Status(ctx, nil) != nil {
		t.Fatal("Status(nil) is not nil")
	}
}

// TestPageTokens: a page's token gives back its key; a token not made by
// the codec, or a size out of range, is a FieldError naming its field.
func TestPageTokens(t *testing.T) {
	for _, key := range []string{"dep_1", "1712345678901/dep_2", "a/b/c"} {
		got, err := api.DecodeToken(api.EncodeToken(key), "List")
		if err != nil || got != key {
			t.Fatalf("DecodeToken(EncodeToken(%q)) = %q, %v", key, got, err)
		}
	}
	for _, bad := range []string{"!!", "a b"} {
		var fe *api.FieldError
		if _, err := api.DecodeToken(bad, "ListThings"); !errors.As(err, &fe) || fe.Field != "page_token" {
			t.Fatalf("DecodeToken(%q) = %v, want a FieldError on page_token", bad, err)
		}
	}
	var fe *api.FieldError
	if _, _, err := api.Parse(501, "", "ListThings", 100, 500); !errors.As(err, &fe) || fe.Field != "page_size" {
		t.Fatalf("Parse(501) = %v, want a FieldError on page_size", err)
	}
	items := []string{"a", "b", "c"}
	page, next := api.Next(items, 2, func(s string) string { return s })
	if len(page) != 2 || next == "" {
		t.Fatalf("Next = %v, %q", page, next)
	}
	if n, after, err := api.Parse(2, next, "ListThings", 100, 500); err != nil || n != 2 || after != "b" {
		t.Fatalf("Parse(next page) = %d, %q, %v", n, after, err)
	}
}
