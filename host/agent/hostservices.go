package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/shared/kinds"
)

// decryptTimeout bounds one DecryptEnv call to ctrl when the plugin's
// context has no deadline.
const decryptTimeout = 20 * time.Second

// hostMetrics count what the host does for plugins.
type hostMetrics struct {
	decrypts       *prometheus.CounterVec
	decryptSeconds prometheus.Histogram
	desired        *prometheus.CounterVec
}

func newHostMetrics(reg prometheus.Registerer) *hostMetrics {
	m := &hostMetrics{
		decrypts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "krane_host_decrypts_total",
			Help: "DecryptEnv calls the host made to ctrl for plugins, by controller and gRPC code.",
		}, []string{"controller", "code"}),
		decryptSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "krane_host_decrypt_seconds",
			Help:    "Latency of DecryptEnv calls to ctrl.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	m.desired = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "krane_host_desired_state_lookups_total",
		Help: "GetDesiredState calls the host made to ctrl for plugins (on-demand repair), by controller and gRPC code.",
	}, []string{"controller", "code"})
	reg.MustRegister(m.decrypts, m.decryptSeconds, m.desired)
	return m
}

// hostServices is the sdk.Host one controller's plugin gets: the host does
// with its ctrl connection (and token) what the plugin may not.
type hostServices struct {
	a          *Agent
	controller string
}

// HostFor is the sdk.Host served to the named controller's plugin.
func (a *Agent) HostFor(controller string) sdk.Host {
	return hostServices{a: a, controller: controller}
}

// DecryptEnv forwards to ctrl, which checks region, blob and audits. The
// host adds one rule: only the controller that reconciles the kind the
// secrets belong to may ask (kind deployment for a deployment's secret
// environment, kind sentinel for a sentinel's credentials, a sen_ id), so
// another plugin cannot read them through the host.
func (h hostServices) DecryptEnv(ctx context.Context, deploymentID string, sealed []byte) (map[string]string, error) {
	a := h.a
	kind := kinds.SecretsKind(deploymentID)
	a.mu.Lock()
	owner, client := a.kindOwner[kind], a.client
	a.mu.Unlock()
	if owner != h.controller {
		a.hostM.decrypts.WithLabelValues(h.controller, codes.PermissionDenied.String()).Inc()
		a.log.Warn("refused a plugin's decryption request: it does not reconcile the kind the secrets belong to", "controller", h.controller, "kind", kind, "id", deploymentID)
		return nil, status.Errorf(codes.PermissionDenied, "controller %q does not reconcile kind %q; only that kind's controller may open the secrets of %s", h.controller, kind, deploymentID)
	}
	if client == nil {
		return nil, status.Error(codes.Unavailable, "the krane host is not connected to ctrl")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, decryptTimeout)
		defer cancel()
	}
	start := time.Now()
	resp, err := client.DecryptEnv(ctx, &clusterv1.DecryptEnvRequest{DeploymentId: deploymentID, EncryptedEnv: sealed})
	a.hostM.decryptSeconds.Observe(time.Since(start).Seconds())
	st := status.Convert(err)
	a.hostM.decrypts.WithLabelValues(h.controller, st.Code().String()).Inc()
	if err != nil {
		a.log.Warn("ctrl did not open a secret environment", "controller", h.controller, kind, deploymentID, "code", st.Code().String(), "reason", st.Message())
		return nil, status.Error(st.Code(), fmt.Sprintf("ctrl: %s", st.Message()))
	}
	a.log.Debug("secret environment opened for a plugin", "controller", h.controller, kind, deploymentID, "variables", len(resp.GetEnv()), "took", time.Since(start))
	return resp.GetEnv(), nil
}

// desiredTimeout bounds one GetDesiredState call to ctrl when the plugin's
// context has no deadline.
const desiredTimeout = 10 * time.Second

// GetDesiredState forwards to ctrl, for kinds this controller reconciles
// only: a plugin repairs its own objects, it does not read another
// controller's desired state.
func (h hostServices) GetDesiredState(ctx context.Context, kind, id string) (sdk.Change, error) {
	a := h.a
	a.mu.Lock()
	owner, client := a.kindOwner[kind], a.client
	a.mu.Unlock()
	if owner != h.controller {
		a.hostM.desired.WithLabelValues(h.controller, codes.PermissionDenied.String()).Inc()
		return sdk.Change{}, status.Errorf(codes.PermissionDenied, "controller %q does not reconcile kind %q; a plugin may look up the desired state of its own kinds only", h.controller, kind)
	}
	if client == nil {
		return sdk.Change{}, status.Error(codes.Unavailable, "the krane host is not connected to ctrl")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, desiredTimeout)
		defer cancel()
	}
	rc, err := client.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: kind, Id: id})
	st := status.Convert(err)
	a.hostM.desired.WithLabelValues(h.controller, st.Code().String()).Inc()
	if err != nil {
		return sdk.Change{}, status.Error(st.Code(), fmt.Sprintf("ctrl: get desired state of %s %s: %s", kind, id, st.Message()))
	}
	ch := sdk.Change{Kind: kind, ID: id, Version: rc.GetVersion(), Deleted: rc.GetDeleted()}
	if s := rc.GetSpec(); s != nil {
		ch.Spec = sdk.Spec{TypeURL: s.GetTypeUrl(), Value: s.GetValue()}
	}
	return ch, nil
}
