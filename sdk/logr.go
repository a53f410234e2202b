package sdk

import (
	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
)

// newLogr adapts hclog to logr so that klog (and with it client-go) logs
// through the plugin's logger instead of stderr, which go-plugin would drop.
func newLogr(l hclog.Logger) logr.Logger { return logr.New(&hclogSink{l: l}) }

type hclogSink struct {
	l    hclog.Logger
	name string
}

func (s *hclogSink) Init(logr.RuntimeInfo) {}

// klog verbosity 0-1 is info, 2-4 debug, 5+ trace: client-go logs request
// traces at 6+.
func (s *hclogSink) Enabled(level int) bool {
	switch {
	case level <= 1:
		return s.l.IsInfo()
	case level <= 4:
		return s.l.IsDebug()
	default:
		return s.l.IsTrace()
	}
}

func (s *hclogSink) Info(level int, msg string, kv ...any) {
	switch {
	case level <= 1:
		s.l.Info(msg, kv...)
	case level <= 4:
		s.l.Debug(msg, kv...)
	default:
		s.l.Trace(msg, kv...)
	}
}

func (s *hclogSink) Error(err error, msg string, kv ...any) {
	s.l.Error(msg, append(kv, "error", err)...)
}

func (s *hclogSink) WithValues(kv ...any) logr.LogSink {
	return &hclogSink{l: s.l.With(kv...), name: s.name}
}

func (s *hclogSink) WithName(name string) logr.LogSink {
	return &hclogSink{l: s.l.Named(name), name: name}
}
