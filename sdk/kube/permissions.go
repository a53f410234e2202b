package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"krane.dev/sdk"
)

// Missing is one verb the plugin's identity may not use.
type Missing struct {
	Verb, Group, Resource, Namespace, Name string
	// Reason is the authorizer's, when it gave one.
	Reason string
}

func (m Missing) String() string {
	res := m.Resource
	if m.Group != "" {
		res += "." + m.Group
	}
	if m.Name != "" {
		res += " " + m.Name
	}
	where := "in every namespace"
	if m.Namespace != "" {
		where = "in namespace " + m.Namespace
	}
	return m.Verb + " " + res + " " + where
}

// MissingPermissionsError names every permission the plugin's identity
// lacks.
type MissingPermissionsError struct {
	// User is who the API server says the plugin is (its ServiceAccount).
	User    string
	Missing []Missing
}

func (e *MissingPermissionsError) Error() string {
	names := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		names[i] = m.String()
	}
	who := "the plugin's identity"
	if e.User != "" {
		who = e.User
	}
	return fmt.Sprintf("%s may not %s: grant these in a ClusterRole bound to it (each plugin ships its rbac.yaml; `kubectl auth can-i VERB RESOURCE --as %s` checks one)",
		who, strings.Join(names, "; "), cmpOr(e.User, "<identity>"))
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// reviewsInFlight bounds the access reviews CheckPermissions has in flight
// at once. The reviews are independent; asked one after another, the few
// dozen of a plugin were a good part of its start-up, and so of a fresh
// host's bootstrap, on a busy API server.
const reviewsInFlight = 16

// CheckPermissions asks the API server, with one SelfSubjectAccessReview
// per verb (up to reviewsInFlight at once), whether the client's identity
// may do everything perms name. It returns a [*MissingPermissionsError]
// naming each verb and resource that is missing, in perms' order, so a
// plugin fails at Configure instead of with an informer that never syncs.
func CheckPermissions(ctx context.Context, c *Clients, perms []sdk.Permission) error {
	reviews := TypedCreate[authorizationv1.SelfSubjectAccessReview](c, "selfsubjectaccessreviews")
	type check struct {
		p    sdk.Permission
		verb string
	}
	var checks []check
	for _, p := range perms {
		for _, verb := range p.Verbs {
			checks = append(checks, check{p, verb})
		}
	}
	answers := make([]*authorizationv1.SelfSubjectAccessReview, len(checks))
	errs := make([]error, len(checks))
	slots := make(chan struct{}, reviewsInFlight)
	var wg sync.WaitGroup
	for i, ch := range checks {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ch.p.Namespace, Verb: ch.verb, Group: ch.p.Group, Resource: ch.p.Resource, Name: ch.p.Name},
			}}
			answers[i], errs[i] = reviews.Create(ctx, review, metav1.CreateOptions{})
		})
	}
	wg.Wait()
	var missing []Missing
	for i, ch := range checks {
		if errs[i] != nil {
			return fmt.Errorf("ask the API server whether this plugin may %s %s (SelfSubjectAccessReview): %w", ch.verb, ch.p.Resource, errs[i])
		}
		if !answers[i].Status.Allowed {
			missing = append(missing, Missing{Verb: ch.verb, Group: ch.p.Group, Resource: ch.p.Resource, Namespace: ch.p.Namespace, Name: ch.p.Name, Reason: answers[i].Status.Reason})
		}
	}
	if len(missing) == 0 {
		return nil
	}
	e := &MissingPermissionsError{Missing: missing}
	self := TypedCreate[authenticationv1.SelfSubjectReview](c, "selfsubjectreviews")
	if r, err := self.Create(ctx, selfReview(), metav1.CreateOptions{}); err == nil {
		e.User = r.Status.UserInfo.Username
	}
	return e
}

func selfReview() *authenticationv1.SelfSubjectReview { return &authenticationv1.SelfSubjectReview{} }

// Uncovered lists what of perms the RBAC rules (a ClusterRole's, bound
// cluster-wide) do not grant. A plugin's test runs it over the rules of
// the rbac.yaml it ships, so the declared permissions and the manifest
// cannot drift apart.
func Uncovered(rules []rbacv1.PolicyRule, perms []sdk.Permission) []Missing {
	var out []Missing
	for _, p := range perms {
		for _, verb := range p.Verbs {
			if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool { return grants(r, p, verb) }) {
				out = append(out, Missing{Verb: verb, Group: p.Group, Resource: p.Resource, Namespace: p.Namespace, Name: p.Name})
			}
		}
	}
	return out
}

func grants(r rbacv1.PolicyRule, p sdk.Permission, verb string) bool {
	has := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	return has(r.APIGroups, p.Group) && has(r.Resources, p.Resource) && has(r.Verbs, verb) &&
		(len(r.ResourceNames) == 0 || p.Name != "" && slices.Contains(r.ResourceNames, p.Name))
}

// Connect builds the clients of a Configure: the client config from the
// host's KubeSource (hooks may wrap it, e.g. CallCounter.Wrap), then checks
// perms with CheckPermissions, so a missing RBAC permission fails
// Configure at once, named.
func Connect(ctx context.Context, src sdk.KubeSource, perms []sdk.Permission, hooks ...func(*rest.Config)) (*Clients, error) {
	rc, err := RESTConfig(src)
	if err != nil {
		return nil, err
	}
	for _, h := range hooks {
		h(rc)
	}
	c, err := NewClients(rc)
	if err != nil {
		return nil, err
	}
	if err := CheckPermissions(ctx, c, perms); err != nil {
		return nil, err
	}
	return c, nil
}
