package controller_test

import "testing"

// BenchmarkBuild is the CPU cost of validating and building one policy,
// paid on every Apply including a resync that ends UNCHANGED.
func BenchmarkBuild(b *testing.B) {
	policy := []byte(`{"endpointSelector":{"matchLabels":{"app":"web"}},
	  "ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel","app":"sentinel"}}],
	              "toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}],
	  "egress":[{"toEntities":["world"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}]}`)
	for b.Loop() {
		if _, err := buildFuzz(policy); err != nil {
			b.Fatal(err)
		}
	}
}
