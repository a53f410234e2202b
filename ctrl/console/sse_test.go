package console

import (
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// sseEvent is an event as a browser's EventSource dispatches it.
type sseEvent struct{ typ, data, id string }

// parseEventStream interprets a text/event-stream body as the HTML
// standard's event-stream interpretation (WHATWG HTML, "Server-sent
// events", 9.2.6) does, which is what browsers implement: a line ends at
// CRLF, LF or a lone CR; an empty line dispatches; a field's value loses
// one leading space; data lines are joined with LF; an event without a
// data field is not dispatched; a trailing event without its empty line
// is dropped.
func parseEventStream(stream string) []sseEvent {
	stream = strings.TrimPrefix(stream, "\uFEFF")
	var out []sseEvent
	var typ, lastID string
	var data strings.Builder
	for len(stream) > 0 {
		end := strings.IndexAny(stream, "\r\n")
		if end < 0 {
			break // no line ending: the stream stopped mid-line
		}
		line := stream[:end]
		if strings.HasPrefix(stream[end:], "\r\n") {
			stream = stream[end+2:]
		} else {
			stream = stream[end+1:]
		}
		switch {
		case line == "":
			if data.Len() == 0 {
				typ = ""
				continue
			}
			d := strings.TrimSuffix(data.String(), "\n")
			t := typ
			if t == "" {
				t = "message"
			}
			out = append(out, sseEvent{typ: t, data: d, id: lastID})
			typ = ""
			data.Reset()
		case strings.HasPrefix(line, ":"):
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				typ = value
			case "data":
				data.WriteString(value)
				data.WriteByte('\n')
			case "id":
				if !strings.Contains(value, "\x00") {
					lastID = value
				}
			}
		}
	}
	return out
}

// normalizeNewlines is data as the browser sees it: every line ending a
// newline.
func normalizeNewlines(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// checkOneEvent encodes data as sendEvent does and parses it as a browser
// would: exactly the one event sent, with its type and its data.
func checkOneEvent(t *testing.T, data string) {
	t.Helper()
	rec := httptest.NewRecorder()
	sendEvent(rec, "live", data, 7)
	sendEvent(rec, "live", "after", 8)
	got := parseEventStream(rec.Body.String())
	want := []sseEvent{{typ: "live", data: normalizeNewlines(data), id: "7"}, {typ: "live", data: "after", id: "8"}}
	if len(got) != len(want) {
		t.Fatalf("data %q: the browser sees %d events %q, want %q", data, len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("data %q: the browser sees event %d as %q, want %q", data, i, got[i], want[i])
		}
	}
}

// TestLiveEventsCarryAnyTextAsData: a value a cluster reported (an agent
// version, an apply error) that holds a lone CR cannot end the live event
// and start one of its own, such as a "signedout" event whose data the
// page's script would navigate to.
func TestLiveEventsCarryAnyTextAsData(t *testing.T) {
	for _, data := range []string{
		"<td>v1</td>",
		"v1\revent: signedout\rdata: https://evil.example/login\r\r",
		"v1\r\revent: signedout\r\ndata: https://evil.example/\n\n",
		"a\r\nb\nc\rd",
		"\r", "\n", "\r\n", "\n\r", "trailing\r", ": comment\r",
		"",
	} {
		checkOneEvent(t, data)
	}
}

// FuzzLiveEventEncoding: whatever the data, a browser parses exactly the
// events sent, each with its data intact (line endings aside).
func FuzzLiveEventEncoding(f *testing.F) {
	for _, s := range []string{"", "x", "a\rb", "a\r\nb", "\r\r", "event: signedout\r\rdata: /", "\uFEFFa", "data: x\n\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		if !utf8.ValidString(data) {
			// Pages are rendered from Go strings by html/template; a
			// browser decodes the stream as UTF-8, so invalid bytes are
			// compared after that decoding.
			data = strings.ToValidUTF8(data, "\uFFFD")
		}
		checkOneEvent(t, data)
	})
}
