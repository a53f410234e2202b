package sdk

import (
	"fmt"
	"io"
	"os/exec"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// ClientOptions say how the host starts one plugin binary.
type ClientOptions struct {
	// Path of the plugin binary.
	Path string
	// SHA256 pins the binary's checksum (hex); empty means unpinned.
	SHA256 []byte
	// Logger receives the plugin's logs (go-plugin re-emits its hclog JSON
	// lines at their own levels).
	Logger hclog.Logger
	// LogLevel is passed to the plugin.
	LogLevel string
	// Environ is the plugin process's base environment; nil gives it the
	// host's own (os.Environ()). A host passes a filtered copy so that its
	// credentials (a ctrl token in a variable) never reach a plugin.
	Environ []string
	// Env is extra environment for the plugin process.
	Env []string
	// Reattach connects to a plugin already running (e.g. in a test process)
	// instead of starting Path.
	Reattach *plugin.ReattachConfig
}

// NewClientConfig returns the go-plugin configuration the krane host uses for
// every plugin: gRPC only, AutoMTLS, the raised message limit, the sha256 pin
// when given, and a process that dies with the host (Pdeathsig on Linux).
// Stray stdout/stderr writes of the plugin are re-logged, never dropped.
func NewClientConfig(o ClientOptions) (*plugin.ClientConfig, error) {
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: pluginSets(&grpcPlugin{}),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		GRPCDialOptions:  dialOptions(),
		Logger:           o.Logger,
		SyncStdout:       lineLogger(o.Logger, "stdout"),
		SyncStderr:       lineLogger(o.Logger, "stderr"),
	}
	if o.Reattach != nil {
		cfg.Reattach = o.Reattach
		// go-plugin#310: a reattached client skips version negotiation and
		// leaves Plugins nil unless we set it.
		cfg.Plugins = pluginSets(&grpcPlugin{})[ProtocolVersion]
		return cfg, nil
	}
	cmd := exec.Command(o.Path)
	base := o.Environ
	if base == nil {
		base = cmd.Environ()
	}
	cmd.Env = append(slices.Clone(base), o.Env...)
	// go-plugin would append the host's whole environment again.
	cfg.SkipHostEnv = true
	if o.LogLevel != "" {
		cmd.Env = append(cmd.Env, EnvLogLevel+"="+o.LogLevel)
	}
	setParentDeathSignal(cmd)
	cfg.Cmd = cmd
	cfg.AutoMTLS = true
	if len(o.SHA256) > 0 {
		if len(o.SHA256) != 32 {
			return nil, fmt.Errorf("sha256 pin for %s must be 32 bytes, got %d", o.Path, len(o.SHA256))
		}
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: o.SHA256, Hash: newSHA256()}
	}
	return cfg, nil
}

// Dispense connects a started go-plugin client and returns the plugin.
func Dispense(c *plugin.Client) (Plugin, error) {
	proto, err := c.Client()
	if err != nil {
		return nil, err
	}
	raw, err := proto.Dispense(pluginName)
	if err != nil {
		return nil, err
	}
	ctl, ok := raw.(Plugin)
	if !ok {
		return nil, fmt.Errorf("plugin served %T, not a krane controller", raw)
	}
	return ctl, nil
}

// lineLogger turns raw writes into debug log lines on l.
func lineLogger(l hclog.Logger, stream string) io.Writer {
	if l == nil {
		return io.Discard
	}
	return l.Named(stream).StandardWriter(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})
}
