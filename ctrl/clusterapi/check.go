package clusterapi

// Limits of a status report that its proto cannot declare: a generic
// kind's status is a google.protobuf.Any holding a Struct, bounded by its
// size as JSON (the column it goes to). Every other bound of a report is
// declared on the messages in proto/krane/cluster/v1/cluster.proto and
// checked by ctrl/bounds, before anything is stored.
const (
	MaxGenericStatusBytes = 256 << 10
)
