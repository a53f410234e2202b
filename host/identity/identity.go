// Package identity gives each plugin a Kubernetes identity of its own.
//
// For a plugin's ServiceAccount the host requests a short-lived token
// (TokenRequest API) with its own credentials, whose role may create
// tokens for the plugins' accounts and nothing else. It writes the token
// and a kubeconfig naming the token file into a directory of the plugin's
// own (mode 0700, files 0600) and hands the plugin that kubeconfig: the
// plugin's start-up RBAC check, its informers and its writes all run as its
// account, so it holds only what its own role grants, and it is never given
// the host's token. Before the token expires the host writes a new one in
// its place; client-go re-reads a token file about once a minute (and at
// once after a 401), so a renewal reaches a running plugin without a
// restart and without a failed call: the old token stays valid well past
// the renewal.
//
// The plugin processes run as the host's Unix user, as child processes in
// one pod. File modes keep other users out; they do not stop a binary that
// sets out to read a sibling's files. Against a binary you do not trust,
// pin its sha256 in krane.hcl.
package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"krane.dev/host/config"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Metrics are the renewals' Prometheus metrics.
type Metrics struct {
	Renewals *prometheus.CounterVec
	Expiry   *prometheus.GaugeVec
}

// NewMetrics registers the identity metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_plugin_token_requests_total",
			Help: "Tokens requested for a controller's ServiceAccount (the first and each renewal), by result (ok, error)."}, []string{"controller", "result"}),
		Expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "krane_host_plugin_token_expiry_timestamp_seconds",
			Help: "When the token the controller's plugin holds expires (Unix time)."}, []string{"controller"}),
	}
	reg.MustRegister(m.Renewals, m.Expiry)
	return m
}

// Minter requests tokens for the plugins' ServiceAccounts with the host's
// own credentials.
type Minter struct {
	client    kubernetes.Interface
	cluster   *clientcmdapi.Cluster
	namespace string
	ttl       time.Duration
	refresh   time.Duration
	// pod is krane's own pod (name, uid); empty outside a pod.
	podName, podUID string
	// anchor is the Secret tokens are bound to, created once (anchorMu).
	anchorMu sync.Mutex
	anchor   *authenticationv1.BoundObjectReference
}

// Tokens die with krane's pod: the API server refuses a token bound to an
// object once that object is gone. A token can be bound to a Pod only if
// the pod runs as the token's ServiceAccount, which krane's pod does not
// (plugins have accounts of their own), so each plugin token is bound to
// a Secret that krane's pod owns: the garbage collector deletes it with
// the pod, and every plugin token of that pod stops working then, however
// long its lifetime. The Secret holds nothing.

// anchorFor returns the object plugin tokens are bound to, creating it on
// first use; nil outside a pod.
func (m *Minter) anchorFor(ctx context.Context) (*authenticationv1.BoundObjectReference, error) {
	if m.podName == "" {
		return nil, nil
	}
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	if m.anchor != nil {
		return m.anchor, nil
	}
	name := "krane-tokens-" + m.podName
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.namespace,
		Labels:          map[string]string{kube.ManagedByLabel: kube.ManagedBy, "app.kubernetes.io/name": "krane"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: m.podName, UID: types.UID(m.podUID)}},
	}}
	_, err := m.client.CoreV1().Secrets(m.namespace).Create(ctx, s, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		// This pod's, made before a restart of krane's container.
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("krane's identity may not create Secret %s/%s, which its plugins' tokens are bound to (they die with krane's pod): apply deploy/base/krane/rbac.yaml (Role krane-token-anchor), or unset kubernetes.plugin_identities.pod_name: %w", m.namespace, name, err)
	case err != nil:
		return nil, fmt.Errorf("create Secret %s/%s, which plugin tokens are bound to: %w", m.namespace, name, err)
	}
	m.anchor = &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: name}
	return m.anchor, nil
}

// NewMinter connects to the API server as krane.hcl's kubernetes block
// says (the host's identity).
func NewMinter(k config.Kubernetes) (*Minter, error) {
	rc, err := kube.RESTConfig(sdk.KubeSource{InCluster: k.Kubeconfig == "", Path: k.Kubeconfig, Context: k.Context})
	if err != nil {
		return nil, err
	}
	return newMinter(rc, k.PluginIdentities)
}

func newMinter(rc *rest.Config, pi config.PluginIdentities) (*Minter, error) {
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	ca := rc.CAData
	if len(ca) == 0 && rc.CAFile != "" {
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			return nil, fmt.Errorf("read the API server's CA for the plugins' kubeconfigs: %w", err)
		}
	}
	cluster := clientcmdapi.NewCluster()
	cluster.Server = rc.Host
	if rc.APIPath != "" && rc.APIPath != "/api" {
		cluster.Server += rc.APIPath
	}
	cluster.CertificateAuthorityData = ca
	cluster.InsecureSkipTLSVerify = rc.Insecure
	cluster.TLSServerName = rc.ServerName
	return &Minter{client: client, cluster: cluster, namespace: pi.Namespace, ttl: pi.TokenTTL, refresh: pi.Refresh,
		podName: pi.PodName, podUID: pi.PodUID}, nil
}

// token is one token the API server issued.
type token struct {
	value           string
	issued, expires time.Time
	refreshAt       time.Time
}

// request asks the API server for a token of account.
func (m *Minter) request(ctx context.Context, account string) (token, error) {
	secs := int64(m.ttl / time.Second)
	bound, err := m.anchorFor(ctx)
	if err != nil {
		return token{}, err
	}
	issued := time.Now()
	tr, err := m.client.CoreV1().ServiceAccounts(m.namespace).CreateToken(ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs, BoundObjectRef: bound}}, metav1.CreateOptions{})
	sa := m.namespace + "/" + account
	switch {
	case err != nil && bound != nil && apierrors.IsNotFound(err) && strings.Contains(err.Error(), bound.Name):
		m.anchorMu.Lock()
		m.anchor = nil // made again at the next request
		m.anchorMu.Unlock()
		return token{}, fmt.Errorf("request a token for ServiceAccount %s bound to Secret %s/%s: the Secret is gone, which happens when the pod it belongs to (%s, uid %s; kubernetes.plugin_identities.pod_name and pod_uid) is gone or is not krane's: %w", sa, m.namespace, bound.Name, m.podName, m.podUID, err)
	case apierrors.IsNotFound(err):
		return token{}, fmt.Errorf("ServiceAccount %s does not exist: apply the plugin's rbac.yaml (it creates the account and its role), or name the plugin's account with service_account in its controller block: %w", sa, err)
	case apierrors.IsForbidden(err):
		return token{}, fmt.Errorf("krane's identity (krane.hcl's kubernetes block) may not request tokens for ServiceAccount %s: apply the plugin's rbac.yaml, which creates the account and grants krane's ServiceAccount create on serviceaccounts/token for it (or name the plugin's account with service_account in its controller block): %w", sa, err)
	case err != nil && bound != nil && (apierrors.IsBadRequest(err) || apierrors.IsNotFound(err)):
		m.anchorMu.Lock()
		m.anchor = nil // made again at the next request
		m.anchorMu.Unlock()
		return token{}, fmt.Errorf("request a token for ServiceAccount %s bound to Secret %s/%s (owned by krane's pod %s): %w", sa, m.namespace, bound.Name, m.podName, err)
	case err != nil:
		return token{}, fmt.Errorf("request a token for ServiceAccount %s: %w", sa, err)
	}
	t := token{value: tr.Status.Token, issued: issued, expires: tr.Status.ExpirationTimestamp.Time}
	life := t.expires.Sub(issued)
	after := life * 8 / 10
	if m.refresh > 0 && m.refresh < after {
		after = m.refresh
	}
	t.refreshAt = issued.Add(after)
	return t, nil
}

// Plugin is one controller's identity for as long as the controller runs:
// its files, the token it holds and their renewal.
type Plugin struct {
	controller, account string
	newMinter           func() (*Minter, error)
	log                 hclog.Logger
	metrics             *Metrics

	mu     sync.Mutex
	minter *Minter
	dir    string
	cur    token
	closed bool
	issued chan struct{} // signalled when Source wrote a token (Run then schedules its renewal)
}

// ForPlugin prepares the identity of controller, ServiceAccount account;
// newMinter is called at the first Source (the host's credentials may not
// be readable yet when krane starts). Run renews it.
func ForPlugin(controller, account string, newMinter func() (*Minter, error), log hclog.Logger, m *Metrics) *Plugin {
	return &Plugin{controller: controller, account: account, newMinter: newMinter, log: log.With("controller", controller, "service_account", account),
		metrics: m, issued: make(chan struct{}, 1)}
}

// refreshMargin: a token this close to expiry is replaced before a plugin
// instance starts with it (client-go may keep it for a minute).
const refreshMargin = 2 * time.Minute

// Source returns the kubeconfig a starting instance of the plugin uses:
// the current token's, or, when none is held or it is about to expire, a
// new one's.
func (p *Plugin) Source(ctx context.Context, qps float32, burst int) (sdk.KubeSource, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return sdk.KubeSource{}, errors.New("the controller stopped")
	}
	if p.cur.value == "" || time.Until(p.cur.expires) < refreshMargin {
		if err := p.renewLocked(ctx); err != nil {
			return sdk.KubeSource{}, err
		}
		select {
		case p.issued <- struct{}{}:
		default:
		}
	}
	return sdk.KubeSource{Path: filepath.Join(p.dir, "kubeconfig"), QPS: qps, Burst: burst}, nil
}

// renewLocked requests a token and writes it (and, the first time, the
// kubeconfig). Caller holds p.mu.
func (p *Plugin) renewLocked(ctx context.Context) error {
	if p.minter == nil {
		m, err := p.newMinter()
		if err != nil {
			return fmt.Errorf("the host cannot reach the API server to request the plugin's token: %w", err)
		}
		p.minter = m
	}
	t, err := p.minter.request(ctx, p.account)
	if err != nil {
		p.metrics.Renewals.WithLabelValues(p.controller, "error").Inc()
		return err
	}
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "krane-plugin-"+p.controller+"-")
		if err != nil {
			return fmt.Errorf("directory for the plugin's credentials: %w", err)
		}
		p.dir = dir // MkdirTemp creates it with mode 0700
		if err := p.writeKubeconfig(); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(p.dir, "token"), []byte(t.value)); err != nil {
		return fmt.Errorf("write the plugin's token: %w", err)
	}
	p.cur = t
	p.metrics.Renewals.WithLabelValues(p.controller, "ok").Inc()
	p.metrics.Expiry.WithLabelValues(p.controller).Set(float64(t.expires.Unix()))
	p.log.Debug("plugin token issued", "expires", t.expires, "renew_at", t.refreshAt)
	return nil
}

func (p *Plugin) writeKubeconfig() error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = p.minter.cluster
	kc.AuthInfos[p.account] = &clientcmdapi.AuthInfo{TokenFile: filepath.Join(p.dir, "token")}
	kc.Contexts[p.account] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: p.account, Namespace: p.minter.namespace}
	kc.CurrentContext = p.account
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("encode the plugin's kubeconfig: %w", err)
	}
	if err := writeFile(filepath.Join(p.dir, "kubeconfig"), data); err != nil {
		return fmt.Errorf("write the plugin's kubeconfig: %w", err)
	}
	return nil
}

// writeFile replaces path atomically (a reader sees the old content or the
// new, never a part), mode 0600.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// Retry bounds of a failed renewal.
var (
	retryMin = time.Second
	retryMax = 30 * time.Second
)

// Run renews the plugin's token before it expires until ctx ends, then
// removes the plugin's files. A failed renewal is logged and retried with
// backoff while the old token still serves.
func (p *Plugin) Run(ctx context.Context) {
	defer p.close()
	var timer <-chan time.Time
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.issued:
			failures = 0
		case <-timer:
			p.mu.Lock()
			err := p.renewLocked(ctx)
			expires := p.cur.expires
			p.mu.Unlock()
			if err == nil {
				failures = 0
				break
			}
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := min(retryMax, retryMin<<min(failures-1, 10))
			p.log.Error("cannot renew the plugin's token; the current one serves until it expires, retrying", "error", err, "expires", expires, "retry_in", delay)
			timer = time.After(delay)
			continue
		}
		p.mu.Lock()
		at := p.cur.refreshAt
		p.mu.Unlock()
		if at.IsZero() {
			timer = nil // no token yet: Source issues the first
			continue
		}
		timer = time.After(time.Until(at))
	}
}

func (p *Plugin) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.dir != "" {
		if err := os.RemoveAll(p.dir); err != nil {
			p.log.Warn("cannot remove the plugin's credentials", "dir", p.dir, "error", err)
		}
	}
	p.metrics.Expiry.DeleteLabelValues(p.controller)
}

// Issue requests one token for account and writes it with its kubeconfig
// into a directory that the returned function removes: for a one-off check
// (krane validate --cluster) as the plugin's identity.
func (m *Minter) Issue(ctx context.Context, account string) (sdk.KubeSource, func(), error) {
	p := &Plugin{controller: account, account: account, minter: m, log: hclog.NewNullLogger(),
		metrics: NewMetrics(prometheus.NewRegistry()), issued: make(chan struct{}, 1)}
	p.mu.Lock()
	err := p.renewLocked(ctx)
	p.mu.Unlock()
	if err != nil {
		p.close()
		return sdk.KubeSource{}, nil, err
	}
	return sdk.KubeSource{Path: filepath.Join(p.dir, "kubeconfig")}, p.close, nil
}
