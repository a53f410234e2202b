package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
)

// mustHex decodes a sha256 that config validation already checked.
func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic("supervisor: unvalidated sha256 " + s)
	}
	return b
}

// fileSHA256 is the hex sha256 of a file's content.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
