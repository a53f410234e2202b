package clusterapi

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of a status report that its proto cannot declare: a generic
// kind's status is a google.protobuf.Any holding a Struct, bounded by its
// size as JSON (the column it goes to). Every other bound of a report is
// declared on the messages in proto/krane/cluster/v1/cluster.proto and
// checked by ctrl/bounds, before anything is stored.
const (
	MaxGenericStatusBytes = 256 << 10
)

// invalidField is InvalidArgument for one field: "field: reason".
func invalidField(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}
