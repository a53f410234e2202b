package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// credentialName is what a credential's or secret variable's name must
// look like: a variable name of at most maxVarName characters (ctrl checks
// the same).
var credentialName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const maxVarName = 256

func validVarName(k string) bool { return len(k) <= maxVarName && credentialName.MatchString(k) }

// maxStdinCredential bounds a value read from stdin.
const maxStdinCredential = 1 << 20

// credentialsFrom collects the credentials of `sentinel deploy`: the files
// first (in order, a later one wins), then each --credential KEY (which
// wins), its value taken from the environment variable KEY, or, for
// KEY=-, from stdin (once). A value is never taken from the command line,
// where process lists and shell history would show it. Errors name files,
// lines and variables, never values.
func credentialsFrom(files, keys []string, lookup func(string) (string, bool), stdin io.Reader) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range files {
		vars, err := readCredentialsFile(f)
		if err != nil {
			return nil, err
		}
		for k, v := range vars {
			out[k] = v
		}
	}
	seen := map[string]bool{}
	usedStdin := ""
	for _, arg := range keys {
		k, rest, withValue := strings.Cut(arg, "=")
		if !validVarName(k) {
			return nil, fmt.Errorf("--credential: an argument of %d characters before '=' is not a variable name (letters, digits and '_', not starting with a digit, at most %d)", len(k), maxVarName)
		}
		if seen[k] {
			return nil, fmt.Errorf("--credential %s is given twice", k)
		}
		var v string
		switch {
		case withValue && rest == "-":
			if usedStdin != "" {
				return nil, fmt.Errorf("--credential %s=-: stdin is read once, for %s already", k, usedStdin)
			}
			b, err := io.ReadAll(io.LimitReader(stdin, maxStdinCredential+1))
			if err != nil {
				return nil, fmt.Errorf("--credential %s=-: read stdin: %w", k, err)
			}
			if len(b) > maxStdinCredential {
				clear(b)
				return nil, fmt.Errorf("--credential %s=-: the value on stdin is larger than %d bytes", k, maxStdinCredential)
			}
			// One trailing newline is what `echo` and most editors add.
			v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
			clear(b)
			usedStdin = k
		case withValue:
			return nil, fmt.Errorf("--credential %s=...: values are never taken from the command line (process lists and shell history show it); "+
				"export %s and pass --credential %s, pass --credential %s=- and write the value to stdin, or use --credentials-file", k, k, k, k)
		default:
			var ok bool
			if v, ok = lookup(k); !ok {
				return nil, fmt.Errorf("--credential %s: no variable %s in this command's environment (export it, or pass --credential %s=- and write the value to stdin)", k, k, k)
			}
		}
		seen[k], out[k] = true, v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// readCredentialsFile reads a credentials file: a JSON object of strings
// when its first non-blank character is '{', otherwise dotenv lines
// (KEY=VALUE, # comments, optional export and quotes; see readDotenv).
func readCredentialsFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--credentials-file: %w", err)
	}
	defer clear(data)
	var out map[string]string
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
		out, err = parseCredentialsJSON(data, "--credentials-file "+path)
	} else {
		out, err = parseDotenv(data, "--credentials-file "+path)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseCredentialsJSON reads {"KEY": "VALUE", ...}: one object of strings
// keyed by variable names, no key twice. Errors name the line, never a
// value nor a key that is no variable name.
func parseCredentialsJSON(data []byte, what string) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	line := func() int { return 1 + bytes.Count(data[:min(int(dec.InputOffset()), len(data))], []byte("\n")) }
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s, line %d: %s", what, line(), fmt.Sprintf(format, args...))
	}
	syntax := func(err error) error {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			n := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
			return fmt.Errorf("%s, line %d: not valid JSON (%v)", what, n, se)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fail("the JSON object is not closed")
		}
		return fail("not valid JSON")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, syntax(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fail("want a JSON object of strings, {\"KEY\": \"VALUE\", ...}")
	}
	out := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		k, _ := tok.(string)
		if !validVarName(k) {
			// Never quoted: a key can be a value put in the wrong place.
			return nil, fail("a key is not a variable name (letters, digits and '_', not starting with a digit, at most %d)", maxVarName)
		}
		tok, err = dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		v, ok := tok.(string)
		if !ok {
			// Name the key, not the value: a number could be a PIN.
			return nil, fail("the value of %s is not a string (quote it)", k)
		}
		if _, dup := out[k]; dup {
			return nil, fail("%s is set twice in the file", k)
		}
		out[k] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, syntax(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fail("text after the JSON object")
	}
	return out, nil
}
