package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// The blob format, version 1. Every field has a fixed place so the parser
// can refuse anything else before any decryption:
//
//	offset        size  field
//	0             3     magic "kve" (krane vault envelope)
//	3             1     format version, 1
//	4             1     n, length of the key id (1..64)
//	5             n     key id: which key-encryption key (KEK) wrapped the data key
//	5+n           12    wrap nonce
//	17+n          48    the data key (32 bytes) sealed with the KEK: AES-256-GCM, 16-byte tag
//	65+n          12    payload nonce
//	77+n          rest  the payload sealed with the data key: AES-256-GCM, at least the 16-byte tag
//
// Additional authenticated data of both seals: the header (bytes 0..5+n),
// one byte telling the two seals apart (1: data key, 2: payload), then the
// deployment id. A blob therefore opens only for the deployment it was
// sealed for, and no header byte can be changed unnoticed.
//
// The payload is the variables, sorted by name: uvarint count, then per
// variable uvarint len(name), name, uvarint len(value), value.
const (
	magic         = "kve"
	formatV1      = 1
	maxKeyIDLen   = 64
	keySize       = 32
	nonceSize     = 12
	tagSize       = 16
	wrappedSize   = keySize + tagSize
	headerFixed   = len(magic) + 2 // magic, version, key id length
	minBlobSize   = headerFixed + 1 + nonceSize + wrappedSize + nonceSize + tagSize
	aadWrappedKey = 1
	aadPayload    = 2
)

// MaxBlobSize bounds a sealed environment. It stays below what one
// Kubernetes Secret can hold (1 MiB), with room for the envelope.
const MaxBlobSize = 768 << 10

// MaxPlaintextSize bounds the variables (names and values) one deployment
// may seal.
const MaxPlaintextSize = MaxBlobSize - 1024

// Errors of Open. None of them carries key or secret material.
var (
	// ErrMalformed: the bytes are not a sealed environment of a known
	// format (wrong magic or version, truncated, oversized).
	ErrMalformed = errors.New("not a sealed environment of a known format (bad header, unknown version, truncated or oversized)")
	// ErrAuthentication: the blob was altered, was sealed for another
	// deployment, or the key with its id is not the key that sealed it.
	ErrAuthentication = errors.New("the sealed environment does not authenticate: it was altered, or it was sealed for another deployment")
)

// UnknownKeyError: the blob names a key id the keyring does not hold.
type UnknownKeyError struct{ ID string }

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("the sealed environment names key %q, which is not in ctrl's keyring (a key must stay in the keyring while blobs sealed with it exist)", e.ID)
}

// envelope is a parsed blob; its slices point into the blob.
type envelope struct {
	header       []byte // magic .. key id
	keyID        string
	wrapNonce    []byte
	wrappedKey   []byte
	payloadNonce []byte
	payload      []byte
}

// parse splits a blob into its fields, checking only the structure.
func parse(blob []byte) (envelope, error) {
	if len(blob) < minBlobSize || len(blob) > MaxBlobSize || string(blob[:len(magic)]) != magic || blob[3] != formatV1 {
		return envelope{}, ErrMalformed
	}
	n := int(blob[4])
	if n == 0 || n > maxKeyIDLen || len(blob) < minBlobSize-1+n {
		return envelope{}, ErrMalformed
	}
	e := envelope{header: blob[:headerFixed+n], keyID: string(blob[headerFixed : headerFixed+n])}
	if !validKeyID(e.keyID) {
		return envelope{}, ErrMalformed
	}
	rest := blob[headerFixed+n:]
	e.wrapNonce, rest = rest[:nonceSize], rest[nonceSize:]
	e.wrappedKey, rest = rest[:wrappedSize], rest[wrappedSize:]
	e.payloadNonce, e.payload = rest[:nonceSize], rest[nonceSize:]
	return e, nil
}

// aad is the additional data of one of the two seals.
func aad(header []byte, which byte, deploymentID string) []byte {
	out := make([]byte, 0, len(header)+1+len(deploymentID))
	out = append(out, header...)
	out = append(out, which)
	return append(out, deploymentID...)
}

// seal encrypts env for deploymentID under kek: a fresh data key per call.
func seal(kek *kek, deploymentID string, env map[string]string) ([]byte, error) {
	plain, err := encodeEnv(env)
	if err != nil {
		return nil, err
	}
	defer clear(plain)
	dataKey := make([]byte, keySize)
	defer clear(dataKey)
	if _, err := rand.Read(dataKey); err != nil {
		return nil, fmt.Errorf("vault: draw a data key: %w", err)
	}
	dek, err := newGCM(dataKey)
	if err != nil {
		return nil, err
	}
	header := make([]byte, 0, headerFixed+len(kek.id))
	header = append(header, magic...)
	header = append(header, formatV1, byte(len(kek.id)))
	header = append(header, kek.id...)

	blob := make([]byte, 0, len(header)+2*nonceSize+wrappedSize+len(plain)+tagSize)
	blob = append(blob, header...)
	wrapNonce := make([]byte, nonceSize)
	payloadNonce := make([]byte, nonceSize)
	if _, err := rand.Read(wrapNonce); err != nil {
		return nil, fmt.Errorf("vault: draw a nonce: %w", err)
	}
	if _, err := rand.Read(payloadNonce); err != nil {
		return nil, fmt.Errorf("vault: draw a nonce: %w", err)
	}
	blob = append(blob, wrapNonce...)
	blob = kek.aead.Seal(blob, wrapNonce, dataKey, aad(header, aadWrappedKey, deploymentID))
	blob = append(blob, payloadNonce...)
	blob = dek.Seal(blob, payloadNonce, plain, aad(header, aadPayload, deploymentID))
	if len(blob) > MaxBlobSize {
		return nil, fmt.Errorf("vault: the sealed environment would be %d bytes; at most %d", len(blob), MaxBlobSize)
	}
	return blob, nil
}

// open decrypts a blob sealed for deploymentID with a key of lookup.
func open(lookup func(id string) *kek, deploymentID string, blob []byte) (map[string]string, string, error) {
	e, err := parse(blob)
	if err != nil {
		return nil, "", err
	}
	kek := lookup(e.keyID)
	if kek == nil {
		return nil, e.keyID, &UnknownKeyError{ID: e.keyID}
	}
	dataKey, err := kek.aead.Open(nil, e.wrapNonce, e.wrappedKey, aad(e.header, aadWrappedKey, deploymentID))
	if err != nil {
		return nil, e.keyID, ErrAuthentication
	}
	defer clear(dataKey)
	dek, err := newGCM(dataKey)
	if err != nil {
		return nil, e.keyID, err
	}
	plain, err := dek.Open(nil, e.payloadNonce, e.payload, aad(e.header, aadPayload, deploymentID))
	if err != nil {
		return nil, e.keyID, ErrAuthentication
	}
	defer clear(plain)
	env, err := decodeEnv(plain)
	if err != nil {
		// Authentic but unreadable: written by a broken sealer, not an attacker.
		return nil, e.keyID, err
	}
	return env, e.keyID, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	return cipher.NewGCM(block)
}

// encodeEnv is the payload encoding: canonical (sorted names), so equal
// variables always give equal plaintext.
func encodeEnv(env map[string]string) ([]byte, error) {
	names := make([]string, 0, len(env))
	size := binary.MaxVarintLen64
	for name, value := range env {
		if name == "" {
			return nil, errors.New("vault: a variable needs a name")
		}
		names = append(names, name)
		size += len(name) + len(value) + 2*binary.MaxVarintLen64
	}
	if size > MaxPlaintextSize {
		return nil, fmt.Errorf("vault: the variables take about %d bytes; at most %d", size, MaxPlaintextSize)
	}
	slices.Sort(names)
	out := make([]byte, 0, size)
	out = binary.AppendUvarint(out, uint64(len(names)))
	for _, name := range names {
		out = binary.AppendUvarint(out, uint64(len(name)))
		out = append(out, name...)
		out = binary.AppendUvarint(out, uint64(len(env[name])))
		out = append(out, env[name]...)
	}
	return out, nil
}

var errPayload = errors.New("vault: the sealed environment authenticated but its content is malformed (sealed by a broken ctrl?)")

func decodeEnv(b []byte) (map[string]string, error) {
	count, n := uvarint(b)
	if n <= 0 || count > uint64(len(b)) {
		return nil, errPayload
	}
	b = b[n:]
	env := make(map[string]string, count)
	prev := ""
	for i := uint64(0); i < count; i++ {
		name, rest, ok := field(b)
		if !ok || name == "" || (i > 0 && name <= prev) {
			return nil, errPayload
		}
		value, rest, ok := field(rest)
		if !ok {
			return nil, errPayload
		}
		env[name], prev, b = value, name, rest
	}
	if len(b) != 0 {
		return nil, errPayload
	}
	return env, nil
}

// field reads one length-prefixed string.
func field(b []byte) (string, []byte, bool) {
	l, n := uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, false
	}
	return string(b[n : n+int(l)]), b[n+int(l):], true
}

// uvarint reads a minimally encoded uvarint (the only encoding Seal
// writes); n <= 0 for anything else.
func uvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 0 && n != len(binary.AppendUvarint(nil, v)) {
		return 0, -1
	}
	return v, n
}
