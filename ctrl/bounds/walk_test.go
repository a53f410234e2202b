package bounds_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/vault"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// overBound is one request past one bound: the field it names, and how to
// make it.
type overBound struct {
	field string
	set   func(m protoreflect.Message)
}

// handlerChecked are the fields whose bound their proto cannot declare (a
// google.protobuf.Any or Struct: their size as JSON, or the bounds of the
// message an Any holds), checked by the handler: how to send a value past
// it, set on the message that holds the field. A new Any or Struct field of a request fails the test until it is
// listed here with its check.
var handlerChecked map[protoreflect.FullName]func(path string) []overBound

func init() {
	handlerChecked = map[protoreflect.FullName]func(path string) []overBound{
		"krane.cluster.v1.ReportStatusRequest.status": func(path string) []overBound {
			out := []overBound{{path, func(m protoreflect.Message) {
				setReport(m, "widget.example.com", mustAny(bigStruct()))
			}}}
			// The built-in kinds' statuses: every bound of the message each
			// kind's Any holds.
			for kind, st := range map[string]proto.Message{
				kinds.Deployment: &clusterv1.DeploymentStatus{}, kinds.Sentinel: &clusterv1.SentinelStatus{}, kinds.CiliumNetworkPolicy: &clusterv1.CiliumNetworkPolicyStatus{},
			} {
				for _, ob := range walk(nil, st.ProtoReflect().Descriptor(), path) {
					out = append(out, overBound{ob.field, func(m protoreflect.Message) {
						inner := st.ProtoReflect().New()
						ob.set(inner)
						setReport(m, kind, mustAny(inner.Interface()))
					}})
				}
			}
			return out
		},
		"krane.ctrl.v1.Resource.spec": func(path string) []overBound {
			return []overBound{{path, func(m protoreflect.Message) {
				// What the handler checks before the spec's size.
				fs := m.Descriptor().Fields()
				m.Set(fs.ByName("kind"), protoreflect.ValueOfString("widget.example.com"))
				m.Set(fs.ByName("id"), protoreflect.ValueOfString("w1"))
				l := m.Mutable(fs.ByName("regions")).List()
				l.Append(protoreflect.ValueOfString("eu"))
				m.Set(fs.ByName("spec"), protoreflect.ValueOfMessage(bigStruct().ProtoReflect()))
			}}}
		},
	}
}

// setReport makes a report message (the root of the path) name an object
// of kind, with status st.
func setReport(m protoreflect.Message, kind string, st *anypb.Any) {
	fs := m.Descriptor().Fields()
	m.Set(fs.ByName("kind"), protoreflect.ValueOfString(kind))
	m.Set(fs.ByName("id"), protoreflect.ValueOfString("obj-1"))
	m.Set(fs.ByName("status"), protoreflect.ValueOfMessage(st.ProtoReflect()))
}

func bigStruct() *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", 300<<10)})
	if err != nil {
		panic(err)
	}
	return s
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// unbounded collects fields that declare no bound.
type unbounded struct{ fields []string }

func (u *unbounded) add(path string, f protoreflect.FieldDescriptor, why string) {
	if u != nil {
		u.fields = append(u.fields, fmt.Sprintf("%s (%s): %s", path, f.FullName(), why))
	}
}

func rulesOf(f protoreflect.FieldDescriptor) *validate.FieldRules {
	r, _ := proto.GetExtension(f.Options(), validate.E_Field).(*validate.FieldRules)
	return r
}

// walk lists, for every field of md reachable from a request, a way past
// its bound; fields without one go to u. Paths are as ctrl names them.
func walk(u *unbounded, md protoreflect.MessageDescriptor, prefix string) []overBound {
	var out []overBound
	fs := md.Fields()
	for i := range fs.Len() {
		f := fs.Get(i)
		path := string(f.Name())
		if prefix != "" {
			path = prefix + "." + path
		}
		r := rulesOf(f)
		switch {
		case f.IsMap():
			out = append(out, mapCases(u, f, r, path)...)
		case f.IsList():
			out = append(out, listCases(u, f, r, path)...)
		case f.Kind() == protoreflect.MessageKind:
			if check, ok := handlerChecked[f.FullName()]; ok {
				// The check sets the field and what else of its message
				// the handler needs to reach it.
				out = append(out, check(path)...)
				continue
			}
			switch f.Message().FullName() {
			case "google.protobuf.Timestamp":
				if gte := r.GetTimestamp().GetGte(); gte != nil {
					out = append(out, overBound{path, func(m protoreflect.Message) {
						ts := m.Mutable(f).Message()
						ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(gte.GetSeconds()-1))
					}})
				}
				continue // a fixed size; a range only when declared
			case "google.protobuf.Any", "google.protobuf.Struct", "google.protobuf.Value":
				u.add(path, f, "an Any or Struct without a check in handlerChecked")
				continue
			}
			for _, ob := range walk(u, f.Message(), path) {
				out = append(out, overBound{ob.field, nested(f, ob.set)})
			}
		default:
			ob, ok := scalarCase(f, r, path, func(m protoreflect.Message, v protoreflect.Value) { m.Set(f, v) })
			if ok {
				out = append(out, ob)
			} else if f.Kind() != protoreflect.BoolKind {
				u.add(path, f, "no bound declared")
			}
		}
	}
	return out
}

// valid fills the fields of a new message that must not be empty (a
// declared minimum length), so that only the field under test is past a
// bound.
func valid(m protoreflect.Message) protoreflect.Message {
	fs := m.Descriptor().Fields()
	for i := range fs.Len() {
		f := fs.Get(i)
		if s := rulesOf(f).GetString(); f.Kind() == protoreflect.StringKind && !f.IsList() && !f.IsMap() && s.GetMinBytes() > 0 {
			m.Set(f, protoreflect.ValueOfString(strings.Repeat("x", int(s.GetMinBytes()))))
		}
	}
	return m
}

// nested applies set to the message held by field f.
func nested(f protoreflect.FieldDescriptor, set func(protoreflect.Message)) func(protoreflect.Message) {
	return func(m protoreflect.Message) { set(m.Mutable(f).Message()) }
}

// scalarCase is a value of a singular scalar past its declared bound.
func scalarCase(f protoreflect.FieldDescriptor, r *validate.FieldRules, path string, set func(protoreflect.Message, protoreflect.Value)) (overBound, bool) {
	v, ok := pastBound(f.Kind(), r)
	if !ok {
		return overBound{}, false
	}
	return overBound{path, func(m protoreflect.Message) { set(m, v) }}, true
}

// pastBound is a value of kind past the bound r declares.
func pastBound(kind protoreflect.Kind, r *validate.FieldRules) (protoreflect.Value, bool) {
	switch kind {
	case protoreflect.StringKind:
		s := r.GetString()
		switch {
		case s.HasMaxBytes():
			return protoreflect.ValueOfString("k" + strings.Repeat("a", int(s.GetMaxBytes()))), true
		case s.HasMaxLen():
			return protoreflect.ValueOfString("k" + strings.Repeat("a", int(s.GetMaxLen()))), true
		case len(s.GetIn()) > 0:
			return protoreflect.ValueOfString("NOT-ONE-OF-THEM"), true
		}
	case protoreflect.BytesKind:
		if b := r.GetBytes(); b.HasMaxLen() {
			return protoreflect.ValueOfBytes(make([]byte, b.GetMaxLen()+1)), true
		}
	case protoreflect.EnumKind:
		if r.GetEnum().GetDefinedOnly() {
			return protoreflect.ValueOfEnum(9999), true
		}
	case protoreflect.Int32Kind:
		n := r.GetInt32()
		switch {
		case n.HasLte() && n.GetLte() < math.MaxInt32:
			return protoreflect.ValueOfInt32(n.GetLte() + 1), true
		case n.HasGte() && n.GetGte() > math.MinInt32:
			return protoreflect.ValueOfInt32(n.GetGte() - 1), true
		}
	case protoreflect.Int64Kind:
		n := r.GetInt64()
		switch {
		case n.HasLte() && n.GetLte() < math.MaxInt64:
			return protoreflect.ValueOfInt64(n.GetLte() + 1), true
		case n.HasGte() && n.GetGte() > math.MinInt64:
			return protoreflect.ValueOfInt64(n.GetGte() - 1), true
		}
	case protoreflect.Uint64Kind:
		if n := r.GetUint64(); n.HasLte() && n.GetLte() < math.MaxUint64 {
			return protoreflect.ValueOfUint64(n.GetLte() + 1), true
		}
	case protoreflect.Uint32Kind:
		if n := r.GetUint32(); n.HasLte() && n.GetLte() < math.MaxUint32 {
			return protoreflect.ValueOfUint32(n.GetLte() + 1), true
		}
	}
	return protoreflect.Value{}, false
}

// zero is a valid element of kind (a key or a list item, where the
// element is not what is being tested).
func zero(kind protoreflect.Kind, i int) protoreflect.Value {
	switch kind {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("k%d", i))
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(0)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(0)
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(0)
	}
	panic(fmt.Sprintf("no element of kind %s", kind))
}

func mapCases(u *unbounded, f protoreflect.FieldDescriptor, r *validate.FieldRules, path string) []overBound {
	mr := r.GetMap()
	if !mr.HasMaxPairs() {
		u.add(path, f, "a map without max_pairs")
		return nil
	}
	key, val := f.MapKey(), f.MapValue()
	newVal := func(m protoreflect.Map, i int) protoreflect.Value {
		if val.Kind() == protoreflect.MessageKind {
			return m.NewValue()
		}
		return zero(val.Kind(), i)
	}
	out := []overBound{{path, func(m protoreflect.Message) {
		mp := m.Mutable(f).Map()
		for i := range int(mr.GetMaxPairs()) + 1 {
			mp.Set(zero(key.Kind(), i).MapKey(), newVal(mp, i))
		}
	}}}
	if v, ok := pastBound(key.Kind(), mr.GetKeys()); ok {
		out = append(out, overBound{path, func(m protoreflect.Message) {
			mp := m.Mutable(f).Map()
			mp.Set(v.MapKey(), newVal(mp, 0))
		}})
	} else {
		u.add(path+" (keys)", f, "map keys without a bound")
	}
	if val.Kind() == protoreflect.MessageKind {
		u.add(path+" (values)", f, "a map of messages: not walked")
	} else if v, ok := pastBound(val.Kind(), mr.GetValues()); ok {
		out = append(out, overBound{path, func(m protoreflect.Message) {
			m.Mutable(f).Map().Set(zero(key.Kind(), 0).MapKey(), v)
		}})
	} else if val.Kind() != protoreflect.BoolKind {
		u.add(path+" (values)", f, "map values without a bound")
	}
	return out
}

func listCases(u *unbounded, f protoreflect.FieldDescriptor, r *validate.FieldRules, path string) []overBound {
	rr := r.GetRepeated()
	if !rr.HasMaxItems() {
		u.add(path, f, "a repeated field without max_items")
		return nil
	}
	out := []overBound{{path, func(m protoreflect.Message) {
		l := m.Mutable(f).List()
		for i := range int(rr.GetMaxItems()) + 1 {
			if f.Kind() == protoreflect.MessageKind {
				e := l.NewElement()
				valid(e.Message())
				l.Append(e)
			} else {
				l.Append(zero(f.Kind(), i))
			}
		}
	}}}
	item := fmt.Sprintf("%s[0]", path)
	if f.Kind() == protoreflect.MessageKind {
		for _, ob := range walk(u, f.Message(), item) {
			out = append(out, overBound{ob.field, func(m protoreflect.Message) {
				l := m.Mutable(f).List()
				e := l.NewElement()
				ob.set(valid(e.Message()))
				l.Append(e)
			}})
		}
		return out
	}
	if v, ok := pastBound(f.Kind(), rr.GetItems()); ok {
		out = append(out, overBound{item, func(m protoreflect.Message) { m.Mutable(f).List().Append(v) }})
	} else if f.Kind() != protoreflect.BoolKind {
		u.add(item, f, "list items without a bound")
	}
	return out
}

// TestEveryRequestFieldIsBounded walks every request message of every
// service ctrl serves (operator, fleet, resource, cluster) from the proto
// descriptors and, for each string, bytes, repeated, map, enum and number
// field (and each field of what a status Any may hold), sends a request
// with a value past its declared bound: each must be refused with
// INVALID_ARGUMENT naming the field, never UNAVAILABLE, INTERNAL or a
// dropped connection, and no row may change. A field without a declared
// bound fails the test.
func TestEveryRequestFieldIsBounded(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(ctrltest.Keyring(t))})
	ctx := context.Background()
	operator := env.Dial(t, env.OperatorToken(t, "bounds"))
	clusterToken := env.ClusterToken(t, "eu", "eu-1")
	cluster := env.Dial(t, clusterToken, auth.RegionHeader, "eu", auth.ClusterIDHeader, "eu-1")
	before := rows(t, env)

	u := &unbounded{}
	methods, cases := 0, 0
	for _, fd := range []protoreflect.FileDescriptor{clusterv1.File_krane_cluster_v1_cluster_proto, ctrlv1.File_krane_ctrl_v1_ctrl_proto, ctrlv1.File_krane_ctrl_v1_fleet_proto} {
		svcs := fd.Services()
		for i := range svcs.Len() {
			svc := svcs.Get(i)
			conn := operator
			if svc.FullName() == "krane.cluster.v1.ClusterService" {
				conn = cluster
			}
			ms := svc.Methods()
			for j := range ms.Len() {
				m := ms.Get(j)
				methods++
				in, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
				if err != nil {
					t.Fatal(err)
				}
				out, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
				if err != nil {
					t.Fatal(err)
				}
				full := fmt.Sprintf("/%s/%s", svc.FullName(), m.Name())
				for _, ob := range walk(u, m.Input(), "") {
					cases++
					req := in.New()
					ob.set(req)
					err := call(ctx, conn, full, m.IsStreamingServer(), req.Interface(), out.New().Interface(), ob.field)
					if err != nil {
						t.Errorf("%s with %s past its bound: %v", full, ob.field, err)
					}
				}
			}
		}
	}
	for _, f := range u.fields {
		t.Errorf("a request field without a declared bound: %s", f)
	}
	if after := rows(t, env); after != before {
		t.Errorf("refused requests changed rows:\nbefore: %s\nafter:  %s", before, after)
	}
	t.Logf("%d methods, %d requests past a bound, each refused naming the field", methods, cases)
}

// call sends req and checks that it was refused naming field.
func call(ctx context.Context, conn *grpc.ClientConn, method string, stream bool, req, resp proto.Message, field string) error {
	var err error
	if stream {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var s grpc.ClientStream
		if s, err = conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method); err == nil {
			if err = s.SendMsg(req); err == nil {
				_ = s.CloseSend()
				err = s.RecvMsg(resp)
			}
		}
	} else {
		err = conn.Invoke(ctx, method, req, resp)
	}
	if err == nil {
		// A batch of reports answers each in its result.
		if r, ok := resp.(*clusterv1.ReportStatusesResponse); ok && len(r.GetResults()) > 0 {
			res := r.GetResults()[0]
			if codes.Code(res.GetCode()) != codes.InvalidArgument {
				return fmt.Errorf("reports[0] answered %s %q, want INVALID_ARGUMENT", codes.Code(res.GetCode()), res.GetMessage())
			}
			if rel := strings.TrimPrefix(field, "reports[0]."); !strings.HasPrefix(res.GetMessage(), rel) {
				return fmt.Errorf("reports[0] answered %q, want it to name %s", res.GetMessage(), rel)
			}
			return nil
		}
		return fmt.Errorf("accepted")
	}
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		return fmt.Errorf("%s %q, want INVALID_ARGUMENT", st.Code(), st.Message())
	}
	if names(st, field) {
		return nil
	}
	return fmt.Errorf("%q does not name %s", st.Message(), field)
}

// names reports whether a refusal names field (or a part of it: a map
// entry, a list item) in its message or its BadRequest detail.
func names(st *status.Status, field string) bool {
	if strings.HasPrefix(st.Message(), field) {
		return true
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if strings.HasPrefix(v.GetField(), field) {
					return true
				}
			}
		}
	}
	return false
}

// rows is a checksum of every table: what a refused request must leave as
// it was.
func rows(t *testing.T, env *ctrltest.Env) string {
	t.Helper()
	ctx := context.Background()
	names, err := env.Store.DB().QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for names.Next() {
		var n string
		if err := names.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	names.Close()
	var b strings.Builder
	for _, tbl := range tables {
		if tbl == "ctrl_replicas" {
			// Each replica's own heartbeat (revocations read, version)
			// runs on a timer, not on a request.
			continue
		}
		var name string
		var sum *int64
		if err := env.Store.DB().QueryRowContext(ctx, "CHECKSUM TABLE `"+tbl+"`").Scan(&name, &sum); err != nil {
			t.Fatal(err)
		}
		if sum != nil {
			fmt.Fprintf(&b, "%s=%d ", tbl, *sum)
		}
	}
	return b.String()
}

// TestSealedBlobsFitDecryptEnv: every blob the vault seals can be sent
// back to ctrl to be opened.
func TestSealedBlobsFitDecryptEnv(t *testing.T) {
	f := (&clusterv1.DecryptEnvRequest{}).ProtoReflect().Descriptor().Fields().ByName("encrypted_env")
	if got := rulesOf(f).GetBytes().GetMaxLen(); got != vault.MaxSealedBytes {
		t.Fatalf("DecryptEnvRequest.encrypted_env is bounded at %d bytes, the vault seals up to %d", got, vault.MaxSealedBytes)
	}
}

// TestKindDescriptionPastItsBoundIsInvalid: a kind whose description is
// longer than its column was refused by the database's insert and told
// "unavailable, retry"; it is refused as invalid, naming the field, and
// nothing is stored.
func TestKindDescriptionPastItsBoundIsInvalid(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	kinds := ctrlv1.NewResourceServiceClient(env.Dial(t, env.OperatorToken(t, "kinds")))
	_, err := kinds.RegisterKind(context.Background(), &ctrlv1.RegisterKindRequest{
		Kind: "quota.example.com", SpecSchema: `{"type": "object"}`, Description: strings.Repeat("d", 1025),
	})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "description: ") {
		t.Fatalf("RegisterKind with a 1025-byte description: %s %q, want INVALID_ARGUMENT naming description", st.Code(), st.Message())
	}
	list, err := kinds.ListKinds(context.Background(), &ctrlv1.ListKindsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range list.GetKinds() {
		if k.GetKind() == "quota.example.com" {
			t.Fatal("the refused kind was registered")
		}
	}
}
