package console

import (
	"time"
)

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
