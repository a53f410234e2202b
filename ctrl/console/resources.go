package console

import (
	"context"
	"time"

	"google.golang.org/grpc"
)

// Resources is where the Resources page reads the objects of plugin
// authors' kinds. Each call's ctx carries the signed-in operator's token as
// outgoing gRPC metadata: an implementation calls ctrl's operator API with
// it, so the page shows only what that token may read.
type Resources interface {
	// Kinds lists the kinds ctrl serves besides the built-in ones.
	Kinds(ctx context.Context) ([]ResourceKind, error)
	// List returns one page of a kind's objects, by id.
	List(ctx context.Context, kind, pageToken string) (ResourcePage, error)
}

// ResourcesFunc builds a Resources on the console's connection to the
// operator API (Options.Resources).
type ResourcesFunc func(conn grpc.ClientConnInterface) Resources

// ResourceKind is a kind of plugin objects.
type ResourceKind struct {
	Name        string
	Description string
}

// ResourcePage is one page of objects.
type ResourcePage struct {
	Items         []Resource
	NextPageToken string
}

// Resource is one object of a kind, in every region it is desired in.
type Resource struct {
	ID      string
	Regions []ResourceRegion
}

// ResourceRegion is an object's state in one region.
type ResourceRegion struct {
	Region string
	// Version is the desired-state version; Deleted marks a deletion.
	Version uint64
	Deleted bool
	// AppliedVersion is the version the region's cluster last reported
	// (0: none yet); Status its latest status, as the plugin wrote it.
	AppliedVersion uint64
	Status         string
	UpdatedAt      time.Time
	// Errors are the clusters' apply errors on this object.
	Errors []ResourceError
}

// ResourceError is a cluster's apply error on one object.
type ResourceError struct {
	ClusterID string
	Version   uint64
	Message   string
	Field     string
	// Permanent: the cluster parked the object until a new version.
	Permanent bool
}

// Behind reports whether the region's cluster has not yet reported the
// desired version.
func (r ResourceRegion) Behind() bool { return r.AppliedVersion < r.Version }
