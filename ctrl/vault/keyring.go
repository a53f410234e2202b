package vault

import (
	"cmp"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// File is the content of a keyring file (YAML or JSON):
//
//	keys:
//	  - id: k20250101-ab3d9x
//	    created_at: 2025-01-01T00:00:00Z
//	    key: <32 random bytes, base64>
//
// The newest key (by created_at, then by position) seals; every key opens.
type File struct {
	Keys []FileKey `json:"keys"`
}

// FileKey is one key-encryption key.
type FileKey struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// Key is 32 random bytes, standard base64.
	Key string `json:"key"`
}

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func validKeyID(id string) bool { return len(id) <= maxKeyIDLen && keyIDPattern.MatchString(id) }

// ParseFile decodes and checks a keyring file. Errors name the key entry
// (by position and id) but never show key material.
func ParseFile(data []byte) (*File, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("not a keyring (want `keys:` with entries of id, created_at and key): %w", err)
	}
	if len(f.Keys) == 0 {
		return nil, errors.New("the keyring holds no key (create one with `ctrl vault init`)")
	}
	ids := map[string]bool{}
	material := map[string]string{}
	for i, k := range f.Keys {
		where := fmt.Sprintf("keys[%d]", i)
		if !validKeyID(k.ID) {
			return nil, fmt.Errorf("%s: id %q must be 1-64 characters of letters, digits, '.', '_' or '-'", where, k.ID)
		}
		where += " (" + k.ID + ")"
		if ids[k.ID] {
			return nil, fmt.Errorf("%s: the id is used twice", where)
		}
		ids[k.ID] = true
		if k.CreatedAt.IsZero() {
			return nil, fmt.Errorf("%s: created_at is required (RFC 3339, e.g. 2025-01-01T00:00:00Z)", where)
		}
		raw, err := base64.StdEncoding.DecodeString(k.Key)
		if err != nil || len(raw) != keySize {
			clear(raw)
			return nil, fmt.Errorf("%s: key must be %d random bytes in standard base64", where, keySize)
		}
		clear(raw)
		if other, dup := material[k.Key]; dup {
			return nil, fmt.Errorf("%s: the same key material as %s (generate keys with `ctrl vault rotate`)", where, other)
		}
		material[k.Key] = k.ID
	}
	return &f, nil
}

// Marshal encodes the file as YAML, keys in their order.
func (f *File) Marshal() ([]byte, error) {
	out, err := yaml.Marshal(f)
	if err != nil {
		return nil, err
	}
	head := "# ctrl vault keyring: key-encryption keys of the sealed environments.\n" +
		"# The newest key seals; every key opens. Never remove a key while a\n" +
		"# deployment sealed with it may still run. Keep this file mode 0600.\n"
	return append([]byte(head), out...), nil
}

// NewKey draws a fresh random key created at now, with a unique id.
func NewKey(now time.Time) (FileKey, error) {
	raw := make([]byte, keySize)
	defer clear(raw)
	if _, err := rand.Read(raw); err != nil {
		return FileKey{}, fmt.Errorf("draw a key: %w", err)
	}
	suffix := make([]byte, 5)
	if _, err := rand.Read(suffix); err != nil {
		return FileKey{}, fmt.Errorf("draw a key id: %w", err)
	}
	id := "k" + now.UTC().Format("20060102") + "-" + strings.ToLower(base32.StdEncoding.EncodeToString(suffix))
	return FileKey{ID: id, CreatedAt: now.UTC().Truncate(time.Second), Key: base64.StdEncoding.EncodeToString(raw)}, nil
}

// Keyring seals and opens sealed environments. It is safe for concurrent
// use.
type Keyring struct {
	newest *kek
	byID   map[string]*kek
}

type kek struct {
	id      string
	created time.Time
	aead    cipher.AEAD
}

// Keyring builds the keys of a checked file.
func (f *File) Keyring() (*Keyring, error) {
	r := &Keyring{byID: map[string]*kek{}}
	order := make([]*kek, 0, len(f.Keys))
	for _, k := range f.Keys {
		raw, err := base64.StdEncoding.DecodeString(k.Key)
		if err != nil || len(raw) != keySize {
			return nil, fmt.Errorf("key %q: not %d bytes of base64", k.ID, keySize)
		}
		aead, err := newGCM(raw)
		clear(raw)
		if err != nil {
			return nil, err
		}
		kk := &kek{id: k.ID, created: k.CreatedAt, aead: aead}
		r.byID[k.ID] = kk
		order = append(order, kk)
	}
	// Stable: among keys created at the same instant, the later one in the
	// file is the newer.
	slices.SortStableFunc(order, func(a, b *kek) int { return a.created.Compare(b.created) })
	r.newest = order[len(order)-1]
	return r, nil
}

// SealingKey is the id of the key new blobs are sealed with.
func (r *Keyring) SealingKey() string { return r.newest.id }

// KeyIDs lists the ids of every key, oldest first.
func (r *Keyring) KeyIDs() []string {
	ks := make([]*kek, 0, len(r.byID))
	for _, k := range r.byID {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b *kek) int { return cmp.Or(a.created.Compare(b.created), strings.Compare(a.id, b.id)) })
	ids := make([]string, len(ks))
	for i, k := range ks {
		ids[i] = k.id
	}
	return ids
}

// MaxSealedBytes bounds a sealed blob: the bound
// krane.cluster.v1.DecryptEnvRequest declares on encrypted_env, so that
// every blob ctrl seals can be opened again (a test holds the two equal).
const MaxSealedBytes = 12 << 20

// Seal encrypts env for one deployment with the newest key. A blob larger
// than MaxSealedBytes is refused: its cluster could not open it.
func (r *Keyring) Seal(deploymentID string, env map[string]string) ([]byte, error) {
	if deploymentID == "" {
		return nil, errors.New("vault: sealing needs the deployment id")
	}
	blob, err := seal(r.newest, deploymentID, env)
	if err == nil && len(blob) > MaxSealedBytes {
		return nil, fmt.Errorf("the %d variables seal to %d bytes; at most %d (keep large values out of secret variables)", len(env), len(blob), MaxSealedBytes)
	}
	return blob, err
}

// Open decrypts a blob sealed for deploymentID. It also returns the id of
// the key that opened it (for the audit), or of the key the blob names when
// that key is unknown.
func (r *Keyring) Open(deploymentID string, blob []byte) (map[string]string, string, error) {
	return open(func(id string) *kek { return r.byID[id] }, deploymentID, blob)
}

// Reseal opens a blob sealed for one deployment and seals its content for
// another (a rollback copies an earlier deployment's secrets), with the
// newest key.
func (r *Keyring) Reseal(fromID string, blob []byte, toID string) ([]byte, error) {
	env, _, err := r.Open(fromID, blob)
	if err != nil {
		return nil, err
	}
	return r.Seal(toID, env)
}

// KeyID returns the key id a blob names, without opening it.
func KeyID(blob []byte) (string, error) {
	e, err := parse(blob)
	return e.keyID, err
}
