package supervisor

import "encoding/hex"

// mustHex decodes a sha256 that config validation already checked.
func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic("supervisor: unvalidated sha256 " + s)
	}
	return b
}
