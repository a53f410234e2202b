package serve

import (
	"net/http"
	"net/http/pprof"
	"runtime"
)

// servePprof adds Go's profiles under /debug/pprof/ (http.pprof) and
// turns on mutex and block sampling, which the runtime leaves off: 1 in
// 100 contended mutex events, and blocking events of 10µs or more.
func servePprof(mux *http.ServeMux) {
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(10_000)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
