package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// RestateCluster is a replicated Restate cluster on one machine: nodes of
// one cluster name on loopback ports, each with its own base directory,
// each running every role (metadata server, log server, worker, admin,
// ingress), with the replicated metadata server and loglet and logs and
// partitions replicated to 2 nodes, so a cluster of 3 goes on when one node
// dies. Every node signs its requests to endpoints with the same request
// identity key (IdentityKey).
type RestateCluster struct {
	Nodes []*Restate
	Name  string
}

// restateReplication is the cluster's log and partition replication.
const restateReplication = 2

// StartRestateCluster starts n nodes (n >= restateReplication) and waits
// until every one answers on its admin API and ingress. Main stops them.
func StartRestateCluster(n int) (*RestateCluster, error) {
	if n < restateReplication {
		return nil, fmt.Errorf("testenv: a Restate cluster replicating to %d nodes needs at least %d", restateReplication, restateReplication)
	}
	bin := RestateServerBin()
	if !isExecutable(bin) {
		return nil, &MissingBinaryError{Binary: "restate-server", Looked: bin, Fix: "run `make testenv` (installs @restatedev/restate-server@" + RestateVersion + " from the npm registry), or set RESTATE_SERVER_BIN"}
	}
	dir, err := SubDir("restate-cluster")
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, identityKeyFile)
	identity, err := writeIdentityKey(keyFile)
	if err != nil {
		return nil, err
	}
	ports, err := FreePorts(3 * n)
	if err != nil {
		return nil, err
	}
	c := &RestateCluster{Name: "krane-test-" + randomHex(4)}
	var addrs []string
	for i := range n {
		node := &Restate{bin: bin, identity: identity, keyFile: keyFile, name: fmt.Sprintf("n%d", i+1),
			adminPort: ports[3*i], ingressPort: ports[3*i+1], nodePort: ports[3*i+2]}
		if node.dir, err = os.MkdirTemp(dir, node.name+"-"); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
		addrs = append(addrs, fmt.Sprintf("%q", node.advertised()))
	}
	for i, node := range c.Nodes {
		node.config = filepath.Join(node.dir, "restate.toml")
		// Exactly one node provisions the cluster; the others join it.
		conf := fmt.Sprintf(`node-name = %q
cluster-name = %q
auto-provision = %v
default-replication = %d
default-num-partitions = 4
rocksdb-total-memory-size = "256MB"
disable-telemetry = true
log-disable-ansi-codes = true
listen-mode = "tcp"
bind-address = "127.0.0.1:%d"
advertised-address = %q

[admin]
bind-address = "127.0.0.1:%d"

[ingress]
bind-address = "127.0.0.1:%d"

[metadata-client]
addresses = [%s]

[bifrost]
default-provider = "replicated"

[worker.invoker]
request-identity-private-key-pem-file = %q
`, node.name, c.Name, i == 0, restateReplication, node.nodePort, node.advertised(), node.adminPort, node.ingressPort, strings.Join(addrs, ", "), keyFile)
		if err := os.WriteFile(node.config, []byte(conf), 0o644); err != nil {
			return nil, err
		}
	}
	errs := make(chan error, n)
	for _, node := range c.Nodes {
		go func() { errs <- node.Start() }()
	}
	var all []error
	for range n {
		all = append(all, <-errs)
	}
	OnStop(c.Stop)
	if err := errors.Join(all...); err != nil {
		return nil, fmt.Errorf("testenv: Restate cluster of %d: %w", n, err)
	}
	return c, nil
}

// advertised is the node's address for its peers.
func (r *Restate) advertised() string { return fmt.Sprintf("http://127.0.0.1:%d/", r.nodePort) }

// startNode starts a cluster node from its configuration file (r.mu held)
// and waits until its admin API and ingress answer.
func (r *Restate) startNode() error {
	p, err := StartProcess(r.dir, "restate-server-"+r.name, r.bin, []string{"--config-file", r.config, "--base-dir", r.dir, "--no-logo"}, nil)
	if err != nil {
		return err
	}
	r.proc = p
	// A node that joins waits for the one that provisions, and for enough
	// log servers: allow for both starting on a loaded machine.
	return p.WaitReady(120*time.Second, func(ctx context.Context) error {
		if err := httpOK(ctx, r.AdminURL()+"/health"); err != nil {
			return err
		}
		return httpOK(ctx, r.IngressURL()+"/restate/health")
	})
}

// Stop stops every node.
func (c *RestateCluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// IdentityKey is the request identity public key every node signs with.
func (c *RestateCluster) IdentityKey() string { return c.Nodes[0].IdentityKey() }
