// Package paging is the keyset paging of ctrl's list APIs keyed by an
// object id: a page size (0 asks for the default) and an opaque token that
// holds the last id of the previous page.
package paging

import (
	"encoding/base64"
	"fmt"
)

// Error is a page size or token the caller got wrong.
type Error struct{ Field, Reason string }

func (e *Error) Error() string { return e.Field + ": " + e.Reason }

// Parse checks a request's page_size (0..max, 0 meaning def) and
// page_token (from a previous answer of method), and returns the size and
// the id the page starts after.
func Parse(size int32, token, method string, def, max int) (int, string, error) {
	n := int(size)
	switch {
	case n < 0 || n > max:
		return 0, "", &Error{Field: "page_size", Reason: fmt.Sprintf("%d is out of range 0..%d (0: %d)", n, max, def)}
	case n == 0:
		n = def
	}
	if token == "" {
		return n, "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) == 0 {
		return 0, "", &Error{Field: "page_token", Reason: "not a token from a previous " + method + " answer"}
	}
	return n, string(b), nil
}

// Next cuts items, read with a limit of size+1, to the page and returns the
// token of the next page ("" when this page is the last).
func Next[T any](items []T, size int, id func(T) string) ([]T, string) {
	if len(items) <= size {
		return items, ""
	}
	items = items[:size]
	return items, base64.RawURLEncoding.EncodeToString([]byte(id(items[size-1])))
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
			return items[:i], base64.RawURLEncoding.EncodeToString([]byte(id(items[i-1])))
		}
	}
	return Next(items, size, id)
}
