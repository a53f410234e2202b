// Package vault seals deployments' secret environment variables (and
// sentinels' credentials, the same way, under the sentinel's id) in ctrl and
// opens them for the clusters that run them.
//
// Envelope encryption: every Seal draws a fresh 32-byte data key, encrypts
// the variables with it (AES-256-GCM) and stores the data key wrapped
// (AES-256-GCM) by a key-encryption key (KEK) from the keyring. The blob
// names the KEK by id, so keys rotate: the newest key seals, every key in
// the keyring opens. The deployment id is authenticated data of both
// encryptions, so a blob opens only for the deployment it was sealed for (a
// rollback, which copies an earlier deployment's secrets, re-seals them for
// the new id). The byte layout is documented in blob.go.
//
// The keyring is a YAML (or JSON) file of {id, created_at, key} entries,
// readable by its owner only; `ctrl vault init` creates it and `ctrl vault
// rotate` appends a key without touching the others. A Source follows the
// file, so a rotation reaches a running ctrl within a second.
//
// Only Go's standard crypto is used (crypto/aes, crypto/cipher,
// crypto/rand). Plaintext buffers this package owns are zeroed after use;
// the strings of the returned maps cannot be (Go strings are immutable).
// Errors never contain key or secret material.
package vault
