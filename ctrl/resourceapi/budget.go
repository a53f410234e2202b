package resourceapi

import (
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// What clusters report is copied into responses, and a status may be
// hundreds of KiB: responses that carry it have byte budgets well under
// ctrl's 16 MiB message limit. A page of ListResources ends at PageBytes (under the 4 MiB a gRPC client
// takes by default);
// one object is cut to EntryBytes by leaving out its largest statuses,
// each marked with its size, rather than failing the call.
const (
	PageBytes  = 3 << 20
	EntryBytes = 1 << 20
)

// fitResource leaves statuses out of info, largest first, until it
// encodes in at most EntryBytes, and returns its encoded size.
func fitResource(info *ctrlv1.ResourceInfo) int {
	size := proto.Size(info)
	if size <= EntryBytes {
		return size
	}
	type slot struct {
		st    **structpb.Struct
		mark  *uint32
		bytes int
	}
	var slots []slot
	for _, r := range info.GetRegions() {
		if r.Status != nil {
			slots = append(slots, slot{&r.Status, &r.StatusOmittedBytes, proto.Size(r.Status)})
		}
		for _, c := range r.GetClusters() {
			if c.Status != nil {
				slots = append(slots, slot{&c.Status, &c.StatusOmittedBytes, proto.Size(c.Status)})
			}
		}
	}
	slices.SortStableFunc(slots, func(a, b slot) int { return b.bytes - a.bytes })
	for _, s := range slots {
		if size <= EntryBytes {
			break
		}
		*s.st, *s.mark = nil, uint32(s.bytes)
		size = proto.Size(info)
	}
	return size
}
