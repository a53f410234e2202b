// Package auth is ctrl's API authentication: the token format, issuing
// tokens (cluster and operator), and the gRPC interceptors that check every
// call.
//
// A token looks like krane_<kind>_<id>_<secret>: kind is "c" (cluster) or
// "o" (operator), id is 12 lowercase base32 characters that name the token
// (safe to log), secret is 32 random bytes in unpadded base64url. ctrl
// stores only SHA-256(secret), keyed by id, and compares in constant time.
// A cluster token fixes the caller's region and cluster id; it may call only
// krane.cluster.v1.ClusterService. An operator token may call only the
// operator APIs (krane.ctrl.v1.*).
//
// A token may carry an expiry (ExpiresIn). A revoked or expired token is
// refused with UNAUTHENTICATED, and the streams it opened are closed: at
// once on the ctrl that revokes it (Authenticator.Revoke), at its expiry
// by a timer per stream, and on every other ctrl within the revocation
// poll interval (Authenticator.WatchRevocations).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"krane.dev/ctrl/store"
)

const (
	tokenPrefix  = "krane_"
	idLen        = 12
	secretBytes  = 32
	secretEncLen = 43 // base64url of 32 bytes, unpadded
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func kindLetter(k store.TokenKind) string {
	if k == store.OperatorToken {
		return "o"
	}
	return "c"
}

// Parsed is a token split into its parts.
type Parsed struct {
	Kind   store.TokenKind
	ID     string
	Secret string
}

// errMalformed never carries the token itself.
var errMalformed = errors.New("the token is malformed (want krane_<c|o>_<id>_<secret>)")

// Parse splits a token. The secret may itself contain '_' (base64url).
func Parse(token string) (Parsed, error) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return Parsed{}, errMalformed
	}
	parts := strings.SplitN(rest, "_", 3)
	if len(parts) != 3 || len(parts[1]) != idLen || len(parts[2]) != secretEncLen {
		return Parsed{}, errMalformed
	}
	var kind store.TokenKind
	switch parts[0] {
	case "c":
		kind = store.ClusterToken
	case "o":
		kind = store.OperatorToken
	default:
		return Parsed{}, errMalformed
	}
	if _, err := idEncoding.DecodeString(parts[1]); err != nil {
		return Parsed{}, errMalformed
	}
	if _, err := base64.RawURLEncoding.DecodeString(parts[2]); err != nil {
		return Parsed{}, errMalformed
	}
	return Parsed{Kind: kind, ID: parts[1], Secret: parts[2]}, nil
}

// HashSecret is what ctrl stores for a secret.
func HashSecret(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// Matches reports whether secret hashes to want, in constant time.
func Matches(secret string, want [32]byte) bool {
	got := HashSecret(secret)
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// newToken draws a fresh token of kind: the string to hand out once, and
// the record to store (hash only).
func newToken(kind store.TokenKind, opts []TokenOption) (string, store.Token, error) {
	var o tokenOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.expiresIn < 0 || o.expiresSet && o.expiresIn == 0 {
		return "", store.Token{}, fmt.Errorf("a token's expiry must be a positive duration, not %s (leave it out for a token that never expires)", o.expiresIn)
	}
	idRaw := make([]byte, 8)
	secret := make([]byte, secretBytes)
	if _, err := rand.Read(idRaw); err != nil {
		return "", store.Token{}, err
	}
	if _, err := rand.Read(secret); err != nil {
		return "", store.Token{}, err
	}
	id := idEncoding.EncodeToString(idRaw)[:idLen]
	sec := base64.RawURLEncoding.EncodeToString(secret)
	rec := store.Token{ID: id, Kind: kind, SecretHash: HashSecret(sec), CreatedAt: time.Now()}
	if o.expiresIn > 0 {
		rec.ExpiresAt = rec.CreatedAt.Add(o.expiresIn)
	}
	return tokenPrefix + kindLetter(kind) + "_" + id + "_" + sec, rec, nil
}

// TokenOption tunes a token being issued.
type TokenOption func(*tokenOptions)

type tokenOptions struct {
	expiresIn  time.Duration
	expiresSet bool
}

// ExpiresIn makes the token expire d after it is issued (d > 0). Without
// it a token is valid until revoked.
func ExpiresIn(d time.Duration) TokenOption {
	return func(o *tokenOptions) { o.expiresIn, o.expiresSet = d, true }
}

// RegisterCluster registers cluster clusterID in region (or adds a token to
// it) and returns the new cluster token. The token is not stored: show it
// once, it cannot be recovered.
func RegisterCluster(ctx context.Context, s *store.Store, region, clusterID string, opts ...TokenOption) (string, error) {
	if !validName(region) || !validName(clusterID) {
		return "", fmt.Errorf("region %q and cluster %q must be 1-64 characters of a-z, 0-9, '-', '_' or '.'", region, clusterID)
	}
	token, rec, err := newToken(store.ClusterToken, opts)
	if err != nil {
		return "", err
	}
	if err := s.RegisterCluster(ctx, clusterID, region, rec); err != nil {
		return "", err
	}
	return token, nil
}

// ClusterRef names a cluster to register: its region and id.
type ClusterRef struct {
	Region, ClusterID string
}

// RegisterClusters registers many clusters at once (or adds a token to
// those already registered in the same region), in one transaction, and
// returns their new tokens in order. All or none: a cluster registered in
// another region, listed twice, or with an invalid name fails the call and
// registers nothing.
func RegisterClusters(ctx context.Context, s *store.Store, clusters []ClusterRef, opts ...TokenOption) ([]string, error) {
	regs := make([]store.ClusterRegistration, len(clusters))
	tokens := make([]string, len(clusters))
	for i, c := range clusters {
		if !validName(c.Region) || !validName(c.ClusterID) {
			return nil, fmt.Errorf("cluster %d (%q in %q): region and cluster must be 1-64 characters of a-z, 0-9, '-', '_' or '.'", i+1, c.ClusterID, c.Region)
		}
		token, rec, err := newToken(store.ClusterToken, opts)
		if err != nil {
			return nil, err
		}
		regs[i], tokens[i] = store.ClusterRegistration{ClusterID: c.ClusterID, Region: c.Region, Token: rec}, token
	}
	if err := s.RegisterClusters(ctx, regs); err != nil {
		return nil, err
	}
	return tokens, nil
}

// CreateOperatorToken stores a new operator token named name and returns
// it (shown once).
func CreateOperatorToken(ctx context.Context, s *store.Store, name string, opts ...TokenOption) (string, error) {
	if strings.TrimSpace(name) == "" || len(name) > 255 {
		return "", errors.New("an operator token needs a name (1-255 characters) saying whose it is")
	}
	token, rec, err := newToken(store.OperatorToken, opts)
	if err != nil {
		return "", err
	}
	rec.Name = name
	if err := s.CreateOperatorToken(ctx, rec); err != nil {
		return "", err
	}
	return token, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}
