package sdk

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "krane.dev/sdk/internal/pluginv1"
)

// ProtocolVersion is the go-plugin protocol version of krane.plugin.v1. It
// changes only with a wire-breaking change; compatible additions keep it.
const ProtocolVersion = 1

// MaxMessageSize caps every gRPC message between host and plugin, both ways.
// Large enough for any realistic object or inventory chunk, small enough that
// a runaway message is a readable error instead of an OOM kill.
const MaxMessageSize = 256 << 20

// pluginName is the single plugin each krane plugin binary serves.
const pluginName = "controller"

// Handshake is shared by the host and every plugin. The cookie only stops a
// user from running a plugin binary by hand; it is not a security measure
// (SecureConfig sha256 pinning is).
var Handshake = plugin.HandshakeConfig{
	MagicCookieKey:   "KRANE_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "f3b6c0de-krane-controller-plugin",
}

// pluginSets maps protocol versions to what is served under them.
func pluginSets(p *grpcPlugin) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{ProtocolVersion: {pluginName: p}}
}

// grpcPlugin is the go-plugin glue: it registers the server shim in the
// plugin process and builds the client shim in the host.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl Controller // plugin side only
}

var _ plugin.GRPCPlugin = (*grpcPlugin)(nil)

func (p *grpcPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterControllerServer(s, &server{impl: p.impl, host: &hostDialer{broker: broker}})
	return nil
}

func (p *grpcPlugin) GRPCClient(doneCtx context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	ctl := NewGRPCController(doneCtx, c).(*grpcController)
	ctl.host = &hostBroker{broker: broker}
	return ctl, nil
}

// serverOptions are the options of every plugin-side gRPC server.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize)}
}

// dialOptions are the options of every host-side connection to a plugin.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize))}
}
