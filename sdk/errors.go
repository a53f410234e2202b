package sdk

import (
	"errors"
	"fmt"
)

// PermanentError marks an Apply failure that retrying cannot fix (invalid
// input, a forbidden namespace, a rejected object). The host reports it
// upstream, parks the change and retries it only rarely and when a newer
// version of the object arrives. Any other error is retried with backoff.
type PermanentError struct {
	// Field is the spec field at fault, when there is one (e.g. "image").
	Field string
	Err   error
}

func (e *PermanentError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// InvalidField returns a permanent error about one spec field.
func InvalidField(field, format string, args ...any) error {
	return &PermanentError{Field: field, Err: fmt.Errorf(format, args...)}
}

// IsPermanent reports whether err (or an error it wraps) is permanent.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// ConfigError is a bad `config {}` block. Key is the dotted path of the
// offending key inside the block.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return "config: " + e.Reason
	}
	return fmt.Sprintf("config key %q: %s", e.Key, e.Reason)
}
