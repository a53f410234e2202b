package kube_test

import (
	"testing"

	"krane.dev/sdk/kube"
)

func TestVerifiedSecretsMatchOnlyTheSameContentAndVersion(t *testing.T) {
	var v kube.VerifiedSecrets
	if v.Is("ns/a", "h1", "7") {
		t.Fatal("an unknown Secret is verified")
	}
	v.Put("ns/a", "h1", "7")
	for _, c := range []struct {
		hash, rv string
		want     bool
	}{{"h1", "7", true}, {"h2", "7", false}, {"h1", "8", false}} {
		if got := v.Is("ns/a", c.hash, c.rv); got != c.want {
			t.Errorf("Is(ns/a, %s, %s) = %v, want %v", c.hash, c.rv, got, c.want)
		}
	}
	v.Forget("ns/a")
	if v.Is("ns/a", "h1", "7") {
		t.Error("a forgotten Secret is still verified")
	}
}
