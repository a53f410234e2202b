package agent

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"krane.dev/host/syncer"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/version"
)

// heartbeatInterval is how often the host tells ctrl it is alive, where its
// cursors stand, which controllers it runs and what it holds parked. A
// variable for tests only.
var heartbeatInterval = 30 * time.Second

// heartbeatState is the heartbeat's side of the agent.
type heartbeatState struct {
	// kick asks for a heartbeat now (a plugin started or stopped): ctrl
	// learns of a new controller at once rather than up to 30s later.
	kick chan struct{}
	// acked is the controllers part (controllersKey) of the last heartbeat
	// ctrl accepted; guarded by Agent.mu.
	acked string
}

// kickHeartbeat asks for a heartbeat now; kicks coalesce.
func (a *Agent) kickHeartbeat() {
	select {
	case a.hb.kick <- struct{}{}:
	default:
	}
}

// heartbeat sends a heartbeat at once, then every heartbeatInterval and
// whenever a controller starts or stops. A failed one is retried sooner
// (1s, doubling), so a host waiting for ctrl to learn its controllers
// (readiness) does not wait a whole interval.
func (a *Agent) heartbeat(ctx context.Context, client clusterv1.ClusterServiceClient) {
	retry := time.Second
	for {
		req, key := a.heartbeatRequest()
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := client.Heartbeat(hctx, req)
		cancel()
		next := heartbeatInterval
		switch {
		case err == nil:
			retry = time.Second
			a.mu.Lock()
			a.hb.acked = key
			a.mu.Unlock()
		case ctx.Err() != nil:
			return
		default:
			a.log.Debug("heartbeat failed", "error", err, "retry_in", retry)
			next, retry = retry, min(2*retry, heartbeatInterval)
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.hb.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// heartbeatRequest is what a heartbeat says now, and the key of its
// controllers part.
func (a *Agent) heartbeatRequest() (*clusterv1.HeartbeatRequest, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	req := &clusterv1.HeartbeatRequest{
		AgentVersion: version.Version, Cursors: map[string]uint64{}, Parked: map[string]int32{},
		HostReport: true, Controllers: a.controllerStatusLocked(),
	}
	a.eachLoopLocked(func(kind string, l *syncer.Loop) {
		if !controllerLimits.kind.MatchString(kind) || len(req.Cursors) == controllerLimits.cursors {
			return // ctrl would refuse the whole heartbeat
		}
		req.Cursors[kind] = l.Cursor()
		if n := l.Parked(); n > 0 && len(req.Parked) < controllerLimits.cursors {
			req.Parked[kind] = int32(n)
		}
	})
	return req, controllersKey(req.Controllers)
}

// controllerStatusLocked describes every enabled controller, by name: the
// version and kinds its plugin last described, whether it runs and, when
// not, why. Caller holds a.mu.
func (a *Agent) controllerStatusLocked() []*clusterv1.ControllerStatus {
	var out []*clusterv1.ControllerStatus
	for _, ctl := range a.cfg.Enabled() {
		cs := &clusterv1.ControllerStatus{Name: ctl.Name}
		if run, ok := a.controllers[ctl.Name]; ok {
			p := run.plugin
			info := p.Info()
			cs.PluginVersion = info.Version
			for _, k := range info.Kinds {
				cs.Kinds = append(cs.Kinds, k.Kind)
			}
			slices.Sort(cs.Kinds)
			cs.Running = p.Running()
			if err := p.LastError(); err != nil && !cs.Running {
				cs.LastError = err.Error()
			}
		}
		fitHeartbeat(cs)
		out = append(out, cs)
	}
	slices.SortFunc(out, func(x, y *clusterv1.ControllerStatus) int { return strings.Compare(x.GetName(), y.GetName()) })
	return out
}

// controllersKey identifies what ctrl's fail-fast check reads of the
// controllers (not their errors).
func controllersKey(cs []*clusterv1.ControllerStatus) string {
	var sb strings.Builder
	for _, c := range cs {
		sb.WriteString(c.GetName() + "\x00" + c.GetPluginVersion() + "\x00" + strings.Join(c.GetKinds(), ",") + "\x00")
		if c.GetRunning() {
			sb.WriteString("running")
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// controllersAckedLocked reports whether ctrl accepted a heartbeat naming
// the controllers as they are now. Caller holds a.mu.
func (a *Agent) controllersAckedLocked() bool {
	return a.hb.acked == controllersKey(a.controllerStatusLocked())
}

// fitHeartbeat cuts what a plugin said of itself (its version, its last
// error, its kinds) to the bounds ctrl's ClusterService declares on
// ControllerStatus, read from the proto's annotations: ctrl refuses a
// heartbeat past one, and a long plugin error must not make the cluster
// look silent.
func fitHeartbeat(cs *clusterv1.ControllerStatus) {
	cs.PluginVersion = clipUTF8(cs.PluginVersion, controllerLimits.pluginVersion)
	cs.LastError = clipUTF8(cs.LastError, controllerLimits.lastError)
	cs.Kinds = slices.DeleteFunc(cs.Kinds, func(k string) bool { return !controllerLimits.kind.MatchString(k) })
	if len(cs.Kinds) > controllerLimits.kinds {
		cs.Kinds = cs.Kinds[:controllerLimits.kinds]
	}
}

// controllerLimits are the bounds of a heartbeat the host must keep.
var controllerLimits = struct {
	pluginVersion, lastError, kinds, cursors int
	kind                                     *regexp.Regexp // a kind name ctrl accepts
}{
	pluginVersion: int(fieldRules(&clusterv1.ControllerStatus{}, "plugin_version").GetString().GetMaxBytes()),
	lastError:     int(fieldRules(&clusterv1.ControllerStatus{}, "last_error").GetString().GetMaxBytes()),
	kinds:         int(fieldRules(&clusterv1.ControllerStatus{}, "kinds").GetRepeated().GetMaxItems()),
	cursors:       int(fieldRules(&clusterv1.HeartbeatRequest{}, "cursors").GetMap().GetMaxPairs()),
	kind:          regexp.MustCompile(fieldRules(&clusterv1.ControllerStatus{}, "kinds").GetRepeated().GetItems().GetString().GetPattern()),
}

func fieldRules(m proto.Message, name protoreflect.Name) *validate.FieldRules {
	fd := m.ProtoReflect().Descriptor().Fields().ByName(name)
	r, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
	return r
}

// clipUTF8 cuts s to at most n bytes, at a character boundary.
func clipUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
