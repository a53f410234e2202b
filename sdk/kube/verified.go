package kube

import "sync"

// VerifiedSecrets remembers, per Secret ("namespace/name"), the hash of
// the sealed content and the resourceVersion of what this process wrote or
// checked. A plugin that materializes sealed values (through the host's
// DecryptEnv) asks Is before opening them: when the live Secret still has
// that resourceVersion, it holds what the same blob gave, so an unchanged
// object is neither decrypted nor written again. Nothing of the values is
// kept. The zero value is ready to use and safe for concurrent use.
type VerifiedSecrets struct {
	mu sync.Mutex
	m  map[string]verifiedSecret
}

type verifiedSecret struct{ contentHash, resourceVersion string }

// Is reports whether key was last written or checked from contentHash and
// is still at resourceVersion.
func (v *VerifiedSecrets) Is(key, contentHash, resourceVersion string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.m[key]
	return ok && e.contentHash == contentHash && e.resourceVersion == resourceVersion
}

// Put records that key holds what contentHash gives, at resourceVersion.
func (v *VerifiedSecrets) Put(key, contentHash, resourceVersion string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[string]verifiedSecret{}
	}
	v.m[key] = verifiedSecret{contentHash, resourceVersion}
}

// Forget drops key (its Secret was deleted).
func (v *VerifiedSecrets) Forget(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.m, key)
}
