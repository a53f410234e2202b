package vault

import (
	"bytes"
	"encoding/base64"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// testKey is a fixed key (tests and the fuzz corpus need stable blobs).
func testKey(id string, fill byte, created time.Time) FileKey {
	return FileKey{ID: id, CreatedAt: created, Key: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, keySize))}
}

func ring(t testing.TB, keys ...FileKey) *Keyring {
	t.Helper()
	data, err := (&File{Keys: keys}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseFile(data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var env = map[string]string{"DATABASE_URL": "postgres://u:hunter2@db/x", "API_KEY": "sk_live_123", "EMPTY": ""}

func TestSealOpenRoundTrip(t *testing.T) {
	r := ring(t, testKey("k1", 1, t0))
	blob, err := r.Seal("dep_a", env)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range env {
		if v != "" && bytes.Contains(blob, []byte(v)) {
			t.Fatalf("blob contains the plaintext %q", v)
		}
	}
	got, keyID, err := r.Open("dep_a", blob)
	if err != nil || keyID != "k1" || !maps.Equal(got, env) {
		t.Fatalf("Open = %v, %q, %v; want %v, k1", got, keyID, err, env)
	}
	// A fresh data key and nonces every time: equal input, different blobs.
	again, _ := r.Seal("dep_a", env)
	if bytes.Equal(blob, again) || bytes.Equal(blob[5+2:5+2+nonceSize], again[5+2:5+2+nonceSize]) {
		t.Error("two seals of the same environment are equal")
	}
	if id, err := KeyID(blob); id != "k1" || err != nil {
		t.Errorf("KeyID = %q, %v", id, err)
	}
	// Empty environments and odd bytes survive.
	odd := map[string]string{"B": "\x00\xff\n", "A": strings.Repeat("x", 70000)}
	for _, e := range []map[string]string{{}, odd} {
		b, err := r.Seal("dep_b", e)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, err := r.Open("dep_b", b); err != nil || !maps.Equal(got, e) {
			t.Errorf("round trip of %d variables: %v", len(e), err)
		}
	}
}

// TestTamperingFails: every way a blob can be wrong fails cleanly, with an
// error that names the problem and carries no secret.
func TestTamperingFails(t *testing.T) {
	r := ring(t, testKey("k1", 1, t0))
	blob, err := r.Seal("dep_a", env)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, want error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: opened", what)
		}
		if !errors.Is(err, want) {
			var uk *UnknownKeyError
			if !(errors.As(want, &uk) && errors.As(err, &uk)) {
				t.Fatalf("%s: %v, want %v", what, err, want)
			}
		}
		for _, v := range env {
			if v != "" && strings.Contains(err.Error(), v) {
				t.Fatalf("%s: error shows a secret: %v", what, err)
			}
		}
	}
	// Every single bit, flipped: the header, either nonce, either tag.
	for i := range len(blob) * 8 {
		b := bytes.Clone(blob)
		b[i/8] ^= 1 << (i % 8)
		_, _, err := r.Open("dep_a", b)
		if err == nil {
			t.Fatalf("bit %d flipped: opened", i)
		}
	}
	_, _, err = r.Open("dep_b", blob)
	check("another deployment's id (AAD)", err, ErrAuthentication)
	_, _, err = r.Open("", blob)
	check("no deployment id", err, ErrAuthentication)
	for _, n := range []int{0, 1, 4, 5, 6, minBlobSize - 1, len(blob) - 1} {
		_, _, err = r.Open("dep_a", blob[:n])
		if n < len(blob)-tagSize {
			check("truncated", err, ErrMalformed)
		} else if err == nil {
			t.Fatalf("truncated to %d: opened", n)
		}
	}
	_, _, err = r.Open("dep_a", append(bytes.Clone(blob), 0))
	check("a byte appended", err, ErrAuthentication)
	_, _, err = r.Open("dep_a", make([]byte, MaxBlobSize+1))
	check("oversized", err, ErrMalformed)

	other := ring(t, testKey("k2", 2, t0))
	_, _, err = other.Open("dep_a", blob)
	check("unknown key id", err, &UnknownKeyError{})
	if !strings.Contains(err.Error(), `"k1"`) {
		t.Errorf("unknown key error does not name the key: %v", err)
	}
	// The same id with other material: the wrap does not authenticate.
	impostor := ring(t, testKey("k1", 9, t0))
	_, _, err = impostor.Open("dep_a", blob)
	check("same id, other key", err, ErrAuthentication)

	// Key id swapped for another known key: the header is authenticated.
	both := ring(t, testKey("k1", 1, t0), testKey("k2", 2, t0.Add(time.Hour)))
	swapped := bytes.Clone(blob)
	copy(swapped[headerFixed:], "k2")
	_, _, err = both.Open("dep_a", swapped)
	check("key id swapped", err, ErrAuthentication)
}

// TestRotation: blobs sealed before and after a rotation both open; the
// newest key seals; a ring without the old key cannot open old blobs.
func TestRotation(t *testing.T) {
	old := ring(t, testKey("k1", 1, t0))
	before, _ := old.Seal("dep_a", env)
	rotated := ring(t, testKey("k1", 1, t0), testKey("k2", 2, t0.Add(time.Hour)))
	if rotated.SealingKey() != "k2" {
		t.Fatalf("sealing key %s, want the newest k2", rotated.SealingKey())
	}
	after, _ := rotated.Seal("dep_b", env)
	if id, _ := KeyID(after); id != "k2" {
		t.Fatalf("sealed after rotation with %s, want k2", id)
	}
	for _, c := range []struct {
		id   string
		blob []byte
	}{{"dep_a", before}, {"dep_b", after}} {
		if got, _, err := rotated.Open(c.id, c.blob); err != nil || !maps.Equal(got, env) {
			t.Errorf("open %s after rotation: %v", c.id, err)
		}
	}
	// Order in the file does not decide: created_at does.
	reversed := ring(t, testKey("k2", 2, t0.Add(time.Hour)), testKey("k1", 1, t0))
	if reversed.SealingKey() != "k2" {
		t.Errorf("sealing key %s, want k2 (newest created_at)", reversed.SealingKey())
	}
	// Reseal moves secrets to a new deployment under the newest key.
	moved, err := rotated.Reseal("dep_a", before, "dep_c")
	if err != nil {
		t.Fatal(err)
	}
	if got, keyID, err := rotated.Open("dep_c", moved); err != nil || keyID != "k2" || !maps.Equal(got, env) {
		t.Errorf("resealed: %v %s %v", got, keyID, err)
	}
	if _, _, err := rotated.Open("dep_a", moved); !errors.Is(err, ErrAuthentication) {
		t.Errorf("resealed blob opens for the old deployment: %v", err)
	}
}

func TestParseFileRefusesBadKeyrings(t *testing.T) {
	good := testKey("k1", 1, t0)
	cases := map[string]string{
		"empty":          "keys: []",
		"unknown key":    "keys:\n- id: k1\n  created_at: 2025-01-01T00:00:00Z\n  key: " + good.Key + "\n  kye: x\n",
		"short key":      "keys:\n- id: k1\n  created_at: 2025-01-01T00:00:00Z\n  key: AAAA\n",
		"not base64":     "keys:\n- id: k1\n  created_at: 2025-01-01T00:00:00Z\n  key: '!!!'\n",
		"no created_at":  "keys:\n- id: k1\n  key: " + good.Key + "\n",
		"bad id":         "keys:\n- id: 'k 1'\n  created_at: 2025-01-01T00:00:00Z\n  key: " + good.Key + "\n",
		"duplicate id":   "keys:\n- id: k1\n  created_at: 2025-01-01T00:00:00Z\n  key: " + good.Key + "\n- id: k1\n  created_at: 2025-01-02T00:00:00Z\n  key: " + testKey("x", 2, t0).Key + "\n",
		"same material":  "keys:\n- id: k1\n  created_at: 2025-01-01T00:00:00Z\n  key: " + good.Key + "\n- id: k2\n  created_at: 2025-01-02T00:00:00Z\n  key: " + good.Key + "\n",
		"not a keyring":  "hello",
		"json, bad type": `{"keys": [{"id": 1}]}`,
	}
	for name, data := range cases {
		_, err := ParseFile([]byte(data))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), good.Key) {
			t.Errorf("%s: error shows key material: %v", name, err)
		}
	}
	// JSON is YAML.
	if _, err := ParseFile([]byte(`{"keys": [{"id": "k1", "created_at": "2025-01-01T00:00:00Z", "key": "` + good.Key + `"}]}`)); err != nil {
		t.Errorf("JSON keyring: %v", err)
	}
}

func TestFileInitRotateAndPermissions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keyring.yaml")
	first, err := Init(path, t0)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("init made mode %#o, want 0600", fi.Mode().Perm())
	}
	if _, err := Init(path, t0); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second init: %v", err)
	}
	before, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Rotate(path, t0) // same instant: still strictly newer
	if err != nil {
		t.Fatal(err)
	}
	after, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Keys) != 2 || after.Keys[0] != before.Keys[0] || after.Keys[1].ID != second.ID || first.ID == second.ID {
		t.Fatalf("rotation rewrote or dropped keys: before %v, after %v", ids(before), ids(after))
	}
	if r, _ := after.Keyring(); r.SealingKey() != second.ID {
		t.Fatalf("sealing key %s after rotation, want %s", r.SealingKey(), second.ID)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("rotation left mode %#o", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("rotation left temporary files: %v", entries)
	}

	// A world- or group-readable keyring is refused, by rotation too, and
	// a refused rotation leaves the file alone.
	content, _ := os.ReadFile(path)
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), "owner only") {
			t.Errorf("mode %#o: read %v", mode, err)
		}
		if _, err := Rotate(path, t0); err == nil {
			t.Errorf("mode %#o: rotated", mode)
		}
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, content) {
		t.Error("a refused rotation changed the file")
	}
}

func ids(f *File) []string {
	var out []string
	for _, k := range f.Keys {
		out = append(out, k.ID)
	}
	return out
}

// TestSourceFollowsTheFile: a rotation reaches a running Source; a broken
// file keeps the previous keys.
func TestSourceFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyring.yaml")
	if _, err := Init(path, t0); err != nil {
		t.Fatal(err)
	}
	s, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Seal("dep_a", env)
	if err != nil {
		t.Fatal(err)
	}
	key, err := Rotate(path, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	waitKey := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for s.Keyring().SealingKey() != want {
			if time.Now().After(deadline) {
				t.Fatalf("sealing key %s, want %s", s.Keyring().SealingKey(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitKey(key.ID)
	after, _ := s.Seal("dep_b", env)
	for id, b := range map[string][]byte{"dep_a": before, "dep_b": after} {
		if _, _, err := s.Open(id, b); err != nil {
			t.Errorf("open %s: %v", id, err)
		}
	}
	// Broken: previous keys stay.
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(recheckEvery + 100*time.Millisecond)
	if got := s.Keyring().SealingKey(); got != key.ID {
		t.Fatalf("a broken file replaced the keys: sealing key %s", got)
	}
	if _, _, err := s.Open("dep_a", before); err != nil {
		t.Fatalf("open after a broken reload: %v", err)
	}
	// Load refuses what Source keeps out.
	if _, err := Load(path, nil); err == nil {
		t.Fatal("Load accepted a broken file")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Fatal("Load accepted a missing file")
	}
}

func TestSealRefusesTooMuch(t *testing.T) {
	r := ring(t, testKey("k1", 1, t0))
	if _, err := r.Seal("dep_a", map[string]string{"BIG": strings.Repeat("x", MaxPlaintextSize)}); err == nil {
		t.Fatal("sealed more than MaxPlaintextSize")
	}
	if _, err := r.Seal("", env); err == nil {
		t.Fatal("sealed without a deployment id")
	}
	if _, err := r.Seal("dep_a", map[string]string{"": "x"}); err == nil {
		t.Fatal("sealed a variable without a name")
	}
}

// FuzzOpen feeds Open arbitrary bytes and deployment ids: nothing panics,
// nothing but the sealed content for the sealed id opens, and every
// failure is one of the documented errors. Seeds:
// testdata/fuzz/FuzzOpen. Run: go test -fuzz FuzzOpen ./ctrl/vault/
func FuzzOpen(f *testing.F) {
	r := ring(f, testKey("k1", 1, t0), testKey("k2", 2, t0.Add(time.Hour)))
	sealed, err := r.Seal("dep_a", env)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed, "dep_a")
	f.Add(sealed[:minBlobSize], "dep_a")
	f.Add([]byte("kve\x01\x02k1"), "dep_a")
	f.Fuzz(func(t *testing.T, blob []byte, id string) {
		got, _, err := r.Open(id, blob)
		if err == nil {
			// Only a seal of env for dep_a can open (fuzz workers are other
			// processes with their own seals, so compare content, not bytes).
			if id != "dep_a" || !maps.Equal(got, env) {
				t.Fatalf("opened a blob that was never sealed: id %q, %d bytes", id, len(blob))
			}
			return
		}
		var uk *UnknownKeyError
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrAuthentication) && !errors.As(err, &uk) && !errors.Is(err, errPayload) {
			t.Fatalf("undocumented error: %v", err)
		}
	})
}

// FuzzDecodeEnv: the payload decoder never panics and accepts only the
// canonical encoding (so decode then encode gives the input back).
func FuzzDecodeEnv(f *testing.F) {
	enc, _ := encodeEnv(env)
	f.Add(enc)
	f.Add([]byte{0})
	f.Add([]byte{2, 1, 'B', 0, 1, 'A', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeEnv(b)
		if err != nil {
			return
		}
		again, err := encodeEnv(got)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded %q from a non-canonical payload %x (re-encoded %x, %v)", got, b, again, err)
		}
	})
}
