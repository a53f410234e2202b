package deployapi

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestFitInstancesKeepsGetDeploymentWithinItsBudget: a deployment whose
// clusters report the most instances they may (with the longest names and
// messages) is cut to the answer's budget, and every instance left out is
// counted in its region.
func TestFitInstancesKeepsGetDeploymentWithinItsBudget(t *testing.T) {
	info := &ctrlv1.DeploymentInfo{Id: "d1"}
	total := 0
	for r := range 3 {
		rs := &ctrlv1.RegionStatus{Region: fmt.Sprintf("r%d", r)}
		for i := range 5000 + r*1000 {
			rs.Instances = append(rs.Instances, &ctrlv1.InstanceInfo{K8SName: fmt.Sprintf("%s-%06d", strings.Repeat("n", 240), i),
				Status: "failed", Reason: strings.Repeat("r", 255), Message: strings.Repeat("m", 1024), ClusterId: "c1"})
			total++
		}
		info.Regions = append(info.Regions, rs)
	}
	fitInstances(info, maxDeploymentBytes)
	kept, omitted := 0, 0
	for _, r := range info.GetRegions() {
		kept += len(r.GetInstances())
		omitted += int(r.GetInstancesOmitted())
	}
	if size := proto.Size(info); size > maxDeploymentBytes || kept+omitted != total || kept == 0 {
		t.Fatalf("after fitting: %d bytes (budget %d), %d instances kept and %d counted as left out of %d", size, maxDeploymentBytes, kept, omitted, total)
	}
	small := &ctrlv1.DeploymentInfo{Regions: []*ctrlv1.RegionStatus{{Instances: []*ctrlv1.InstanceInfo{{K8SName: "a"}}}}}
	if fitInstances(small, maxDeploymentBytes); len(small.Regions[0].Instances) != 1 || small.Regions[0].InstancesOmitted != 0 {
		t.Fatalf("a small answer was cut: %v", small)
	}
}
