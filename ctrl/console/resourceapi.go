package console

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// resourceAPI is where the Resources page reads the objects of plugin
// authors' kinds: ctrl's resource API (krane.ctrl.v1.ResourceService),
// called like every other page with the signed-in operator's token (the
// ctx's outgoing gRPC metadata), so the page shows only what that token
// may read.
type resourceAPI struct{ c ctrlv1.ResourceServiceClient }

func (a resourceAPI) Kinds(ctx context.Context) ([]ResourceKind, error) {
	resp, err := a.c.ListKinds(ctx, &ctrlv1.ListKindsRequest{})
	if err != nil {
		return nil, err
	}
	kinds := make([]ResourceKind, 0, len(resp.GetKinds()))
	for _, k := range resp.GetKinds() {
		kinds = append(kinds, ResourceKind{Name: k.GetKind(), Description: k.GetDescription()})
	}
	return kinds, nil
}

// resourcePageSize keeps a page readable; the page links to the next one.
const resourcePageSize = 100

func (a resourceAPI) List(ctx context.Context, kind, pageToken string) (ResourcePage, error) {
	resp, err := a.c.ListResources(ctx, &ctrlv1.ListResourcesRequest{Kind: kind, PageSize: resourcePageSize, PageToken: pageToken})
	if err != nil {
		return ResourcePage{}, err
	}
	page := ResourcePage{NextPageToken: resp.GetNextPageToken()}
	for _, info := range resp.GetResources() {
		page.Items = append(page.Items, resourceFromAPI(info))
	}
	return page, nil
}

// resourceFromAPI is the page's view of one object of the resource API.
func resourceFromAPI(info *ctrlv1.ResourceInfo) Resource {
	r := Resource{ID: info.GetResource().GetId()}
	for _, reg := range info.GetRegions() {
		v := ResourceRegion{
			Region: reg.GetRegion(), Version: reg.GetVersion(), Deleted: reg.GetDeleted(),
			AppliedVersion: reg.GetObservedVersion(),
		}
		if st := reg.GetStatus(); st != nil {
			if b, err := protojson.Marshal(st); err == nil {
				v.Status = string(b)
			}
		}
		if n := reg.GetStatusOmittedBytes(); n > 0 {
			v.Status = fmt.Sprintf("(%d bytes, left out of the list to keep it small)", n)
		}
		if ts := reg.GetObservedAt(); ts != nil {
			v.UpdatedAt = ts.AsTime()
		}
		for _, e := range reg.GetErrors() {
			v.Errors = append(v.Errors, ResourceError{
				ClusterID: e.GetClusterId(), Version: e.GetVersion(), Message: e.GetMessage(),
				Field: e.GetField(), Permanent: e.GetPermanent(),
			})
		}
		r.Regions = append(r.Regions, v)
	}
	return r
}
