package deployapi_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/sdk"
	"krane.dev/shared/kinds"
)

// validValues are the workload fields whose rules a generated value would
// break (by path from the workload); every other field gets one made from
// its kind and field number (fill).
var validValues = map[string]any{
	"image":              "registry.test/shape:7",
	"shutdown_signal":    "SIGINT",
	"healthcheck.method": "POST",
	"healthcheck.path":   "/ready",
}

// fill sets every field of m, recursively, to a valid value that is not
// the field's default and differs between fields (ints: 100 + field number
// + 20 per level), so a field that falls back to another's value shows.
func fill(t *testing.T, m protoreflect.Message, prefix string, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		path := prefix + string(fd.Name())
		if v, ok := validValues[path]; ok {
			m.Set(fd, protoreflect.ValueOf(v))
			continue
		}
		n := 100 + int64(fd.Number()) + 20*int64(depth)
		s := fmt.Sprintf("X_%s_%d", strings.ToUpper(string(fd.Name())), n)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(protoreflect.ValueOfString(s).MapKey(), protoreflect.ValueOfString("value of "+s))
		case fd.IsList():
			l := m.Mutable(fd).List()
			l.Append(protoreflect.ValueOfString(s))
			l.Append(protoreflect.ValueOfString("--second"))
		case fd.Kind() == protoreflect.MessageKind:
			fill(t, m.Mutable(fd).Message(), path+".", depth+1)
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(s))
		case fd.Kind() == protoreflect.Int32Kind:
			m.Set(fd, protoreflect.ValueOfInt32(int32(n)))
		case fd.Kind() == protoreflect.Int64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(n))
		case fd.Kind() == protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		case fd.Kind() == protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len()-1).Number()))
		default:
			t.Fatalf("workload field %s is a %s: teach fill a valid value of it (or name one in validValues)", path, fd.Kind())
		}
	}
}

// leaves are the paths of every field of a filled message, nested ones
// included ("healthcheck.path").
func leaves(m protoreflect.Message, prefix string) []string {
	var out []string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := prefix + string(fd.Name())
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && !fd.IsList() {
			out = append(out, leaves(v.Message(), path+".")...)
		} else {
			out = append(out, path)
		}
		return true
	})
	return out
}

// valueAt is the value of the field at path in m, and whether it is set.
func valueAt(m protoreflect.Message, path string) (protoreflect.Value, bool) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(p))
		if !m.Has(fd) {
			return protoreflect.Value{}, false
		}
		m = m.Get(fd).Message()
	}
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(parts[len(parts)-1]))
	return m.Get(fd), m.Has(fd)
}

// clearPath is a copy of w without the field at path.
func clearPath(w *clusterv1.Workload, path string) *clusterv1.Workload {
	out := proto.CloneOf(w)
	m := out.ProtoReflect()
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		m = m.Mutable(m.Descriptor().Fields().ByName(protoreflect.Name(p))).Message()
	}
	m.Clear(m.Descriptor().Fields().ByName(protoreflect.Name(parts[len(parts)-1])))
	return out
}

// TestEveryWorkloadFieldReachesThePlugin walks the Workload message's
// fields by reflection: a workload with every field set goes in through
// the deploy API, is stored, comes out of the clusters' stream as the
// plugin's ApplyRequest, and must arrive there unchanged, field by field;
// and the plugin's build must use every field (its pod template changes
// without it). A field dropped anywhere on the way fails here, and a new
// field is covered with nothing to add (unless its rules need a chosen
// value: validValues).
func TestEveryWorkloadFieldReachesThePlugin(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	want := &clusterv1.Workload{}
	fill(t, want.ProtoReflect(), "", 0)
	paths := leaves(want.ProtoReflect(), "")
	if n := want.ProtoReflect().Descriptor().Fields().Len(); len(paths) < n {
		t.Fatalf("only %d paths for %d fields: %v", len(paths), n, paths)
	}
	resp, err := api.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{WorkspaceId: "ws1", ProjectId: "proj1", AppId: "app1",
		EnvironmentId: "env-w", Replicas: 2, Workload: want})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetDeploymentId()

	// The clusters' stream, as the host reads it and hands it to the
	// plugin (host/syncer: a ResourceChange becomes an sdk.Change).
	stream, err := eu.Client.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	var apply *sdk.ApplyRequest
	for apply == nil {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("the stream ended before deployment %s came: %v", id, err)
		}
		if c := ev.GetChange(); c.GetId() == id && !c.GetDeleted() {
			apply = &sdk.ApplyRequest{Change: sdk.Change{Kind: c.GetKind(), ID: c.GetId(), Version: c.GetVersion(),
				Spec: sdk.Spec{TypeURL: c.GetSpec().GetTypeUrl(), Value: c.GetSpec().GetValue()}}}
		}
	}
	d := &clusterv1.Deployment{}
	if err := apply.Spec.Decode(d); err != nil {
		t.Fatal(err)
	}
	info, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		for where, got := range map[string]*clusterv1.Workload{"the plugin's ApplyRequest": d.GetWorkload(), "GetDeployment": info.GetWorkload()} {
			g, ok := valueAt(got.ProtoReflect(), path)
			w, _ := valueAt(want.ProtoReflect(), path)
			if !ok || !g.Equal(w) {
				t.Errorf("workload field %s did not reach %s unchanged: got %v (set: %t), want %v", path, where, g, ok, w)
			}
		}
	}
	if d.GetReplicas() != 2 || d.GetImage() != want.GetImage() {
		t.Errorf("the cluster wire: replicas %d, image (the previous release's field) %q", d.GetReplicas(), d.GetImage())
	}

	// The plugin's build uses every field: without it, the pod template
	// differs.
	cfg := controller.Defaults()
	full := controller.BuildReplicaSet(id, apply.Version, d, cfg).Spec.Template.Spec
	for _, path := range paths {
		dd := proto.CloneOf(d)
		dd.Workload = clearPath(d.GetWorkload(), path)
		if reflect.DeepEqual(controller.BuildReplicaSet(id, apply.Version, dd, cfg).Spec.Template.Spec, full) {
			t.Errorf("the deployment plugin's build ignores workload field %s: the pod template is the same without it", path)
		}
	}
}
