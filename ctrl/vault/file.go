package vault

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ReadFile reads and checks a keyring file. The file must be a regular file
// readable by its owner only: it holds the keys of every sealed secret.
func ReadFile(path string) (*File, error) {
	fi, err := os.Stat(path) // follows symlinks, as Kubernetes Secret volumes use
	if err != nil {
		return nil, fmt.Errorf("vault keyring: %w", err)
	}
	if err := checkMode(path, fi); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vault keyring: %w", err)
	}
	defer clear(data)
	f, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("vault keyring %s: %w", path, err)
	}
	return f, nil
}

func checkMode(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("vault keyring %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("vault keyring %s has mode %#o: it holds the keys of every sealed secret and must be readable by its owner only "+
			"(chmod 600 it; mounted from a Kubernetes Secret, set defaultMode: 0400 on the volume)", path, perm)
	}
	return nil
}

// Init creates a keyring file with one fresh key, mode 0600. It refuses to
// overwrite an existing file.
func Init(path string, now time.Time) (FileKey, error) {
	key, err := NewKey(now)
	if err != nil {
		return FileKey{}, err
	}
	data, err := (&File{Keys: []FileKey{key}}).Marshal()
	if err != nil {
		return FileKey{}, err
	}
	defer clear(data)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return FileKey{}, fmt.Errorf("vault keyring %s already exists: add a key with `ctrl vault rotate` instead", path)
	}
	if err != nil {
		return FileKey{}, fmt.Errorf("vault keyring: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return FileKey{}, fmt.Errorf("vault keyring %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return FileKey{}, fmt.Errorf("vault keyring %s: %w", path, err)
	}
	return key, f.Close()
}

// Rotate appends a fresh key to a keyring file, which then seals every new
// blob. Existing keys are kept as they are, so every blob sealed before
// still opens. The file is replaced atomically (a crash leaves the old or
// the new file, never half of one); it must be owner-only, like ReadFile
// demands.
func Rotate(path string, now time.Time) (FileKey, error) {
	f, err := ReadFile(path)
	if err != nil {
		return FileKey{}, err
	}
	key, err := NewKey(now)
	if err != nil {
		return FileKey{}, err
	}
	for _, k := range f.Keys {
		// Two rotations within a second would otherwise tie on created_at;
		// keep the new key strictly the newest.
		if !key.CreatedAt.After(k.CreatedAt) {
			key.CreatedAt = k.CreatedAt.Add(time.Second)
		}
	}
	f.Keys = append(f.Keys, key)
	data, err := f.Marshal()
	if err != nil {
		return FileKey{}, err
	}
	defer clear(data)
	if err := writeAtomic(path, data); err != nil {
		return FileKey{}, err
	}
	return key, nil
}

// writeAtomic replaces path with data through a temporary file (mode 0600)
// in the same directory.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("vault keyring: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("vault keyring: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("vault keyring: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("vault keyring: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("vault keyring: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("vault keyring: replace %s: %w", path, err)
	}
	done = true
	return nil
}

// recheckEvery bounds how often a Source looks at its file.
const recheckEvery = time.Second

// Source is a keyring that follows its file: when the file changes (a
// rotation, a remounted Kubernetes Secret), the new keys are used from the
// next call on. A changed file that cannot be loaded is logged and the
// previous keys stay in use, so a bad edit never stops ctrl from opening
// what it sealed.
type Source struct {
	path string
	log  hclog.Logger

	mu      sync.Mutex
	ring    *Keyring
	info    fs.FileInfo
	checked time.Time
	failed  fs.FileInfo // the version that failed to load, logged once
}

// Load reads the keyring at path; it fails when the file is missing,
// readable by others or malformed.
func Load(path string, log hclog.Logger) (*Source, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Source{path: path, log: log.Named("vault")}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("vault keyring: %w", err)
	}
	f, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	if s.ring, err = f.Keyring(); err != nil {
		return nil, fmt.Errorf("vault keyring %s: %w", path, err)
	}
	s.info, s.checked = fi, time.Now()
	s.log.Info("vault keyring loaded", "file", path, "keys", s.ring.KeyIDs(), "sealing_key", s.ring.SealingKey())
	return s, nil
}

// Keyring returns the current keys, reloading the file when it changed.
func (s *Source) Keyring() *Keyring {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < recheckEvery {
		return s.ring
	}
	s.checked = time.Now()
	fi, err := os.Stat(s.path)
	if err != nil {
		s.logFailure(nil, err)
		return s.ring
	}
	if sameVersion(fi, s.info) || sameVersion(fi, s.failed) {
		return s.ring
	}
	f, err := ReadFile(s.path)
	var ring *Keyring
	if err == nil {
		ring, err = f.Keyring()
	}
	if err != nil {
		s.logFailure(fi, err)
		return s.ring
	}
	s.ring, s.info, s.failed = ring, fi, nil
	s.log.Info("vault keyring reloaded", "file", s.path, "keys", ring.KeyIDs(), "sealing_key", ring.SealingKey())
	return s.ring
}

func (s *Source) logFailure(fi fs.FileInfo, err error) {
	if fi != nil && sameVersion(fi, s.failed) {
		return
	}
	s.failed = fi
	s.log.Error("vault keyring file changed but cannot be loaded; the previous keys stay in use", "file", s.path, "error", err)
}

// sameVersion: the same file (device and inode) with the same size, mode
// and modification time. A Kubernetes Secret update swaps a symlink, so the
// inode changes even when the size and time would not; a chmod that fixes
// a refused file changes the mode.
func sameVersion(a, b fs.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size() && a.Mode() == b.Mode()
}

// Seal seals env for deploymentID with the newest key.
func (s *Source) Seal(deploymentID string, env map[string]string) ([]byte, error) {
	return s.Keyring().Seal(deploymentID, env)
}

// Open opens a blob sealed for deploymentID; see Keyring.Open.
func (s *Source) Open(deploymentID string, blob []byte) (map[string]string, string, error) {
	return s.Keyring().Open(deploymentID, blob)
}

// Reseal re-seals a blob for another deployment; see Keyring.Reseal.
func (s *Source) Reseal(fromID string, blob []byte, toID string) ([]byte, error) {
	return s.Keyring().Reseal(fromID, blob, toID)
}
