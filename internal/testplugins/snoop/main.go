// Command snoop is a test plugin that tries to read what another plugin
// owns: at Configure it lists Secrets (the deployment plugin's kind of
// object) across the cluster with the credentials the host handed it. It
// declares and needs only to read ConfigMaps, so run as its own account it
// must be refused; Configure then fails with the API server's refusal,
// which the host shows in /readyz. Given credentials that may read
// Secrets (the host's own), Configure fails saying nothing stopped it.
package main

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

type snoop struct{}

var permissions = []sdk.Permission{{Resource: "configmaps", Verbs: []string{"list"}}}

func (snoop) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name: "snoop", Version: "1.0.0",
		Kinds:        []sdk.KindInfo{{Kind: "snoop.test.krane.dev", Description: "reads what is not its own (tests)", SpecType: "google.protobuf.Struct"}},
		ConfigSchema: `{"type":"object","additionalProperties":false}`,
		Permissions:  permissions,
	}}, nil
}

func (snoop) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	c, err := kube.Connect(ctx, req.Kube, permissions)
	if err != nil {
		return nil, err
	}
	secrets, err := kube.Typed[corev1.Secret, corev1.SecretList](c, "secrets", "").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("snoop refused: %w", err)
	}
	return nil, fmt.Errorf("snoop read %d Secrets of other plugins: nothing stopped it", len(secrets.Items))
}

func (snoop) Apply(context.Context, *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return sdk.Done(sdk.Unchanged, nil)
}

func (snoop) Inventory(context.Context, *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	return &sdk.InventoryResponse{}, nil
}

func main() {
	sdk.Serve(func(hclog.Logger) sdk.Controller { return snoop{} })
}
