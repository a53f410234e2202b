package api

import (
	"encoding/base64"
	"fmt"
)

// Keyset paging of ctrl's list APIs: a page size (0 asks for the default)
// and an opaque page token that holds the key the next page starts after
// (an object id, or a longer key a list orders by). EncodeToken and
// DecodeToken are the one codec of page tokens.

// EncodeToken makes the page token of key.
func EncodeToken(key string) string { return base64.RawURLEncoding.EncodeToString([]byte(key)) }

// DecodeToken returns the key of a page token from a previous answer of
// method ("" for no token); a token that is not one is a *FieldError
// naming page_token.
func DecodeToken(token, method string) (string, error) {
	if token == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) == 0 {
		return "", &FieldError{Field: "page_token", Reason: "not a token from a previous " + method + " answer"}
	}
	return string(b), nil
}

// Parse checks a request's page_size (0..max, 0 meaning def) and
// page_token (from a previous answer of method), and returns the size and
// the key the page starts after. Its errors are *FieldErrors.
func Parse(size int32, token, method string, def, max int) (int, string, error) {
	n := int(size)
	switch {
	case n < 0 || n > max:
		return 0, "", &FieldError{Field: "page_size", Reason: fmt.Sprintf("%d is out of range 0..%d (0: %d)", n, max, def)}
	case n == 0:
		n = def
	}
	key, err := DecodeToken(token, method)
	if err != nil {
		return 0, "", err
	}
	return n, key, nil
}

// Next cuts items, read with a limit of size+1, to the page and returns the
// token of the next page ("" when this page is the last).
func Next[T any](items []T, size int, id func(T) string) ([]T, string) {
	if len(items) <= size {
		return items, ""
	}
	items = items[:size]
	return items, EncodeToken(id(items[size-1]))
}

// NextWithin is Next for items that carry what clusters reported: the page
// also ends before the item that would take it beyond maxBytes (by the
// sizes bytes gives; the first item always fits, its own size being the
// caller's to bound), so a response never outgrows its transport however
// large each item is.
func NextWithin[T any](items []T, size, maxBytes int, id func(T) string, bytes func(T) int) ([]T, string) {
	total := 0
	for i, it := range items {
		if i == size {
			break
		}
		total += bytes(it)
		if i > 0 && total > maxBytes {
			return items[:i], EncodeToken(id(items[i-1]))
		}
	}
	return Next(items, size, id)
}
