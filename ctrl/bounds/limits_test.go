package bounds_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/resourceapi"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

var update = flag.Bool("update", false, "rewrite the Limits table of docs/operating.md from the protos")

const (
	limitsDoc   = "../../docs/operating.md"
	limitsBegin = "<!-- limits:begin (generated from the protos' annotations: go test ./ctrl/bounds -run TestLimitsTable -update) -->\n"
	limitsEnd   = "<!-- limits:end -->\n"
)

// TestLimitsTableIsCurrent: docs/operating.md's Limits table is what the
// protos declare (and what the handlers check where a proto cannot
// declare it); -update rewrites it.
func TestLimitsTableIsCurrent(t *testing.T) {
	doc, err := os.ReadFile(limitsDoc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	begin, end := strings.Index(text, limitsBegin), strings.Index(text, limitsEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s has no Limits table between %q and %q", limitsDoc, limitsBegin, limitsEnd)
	}
	want := limitsTable()
	got := text[begin+len(limitsBegin) : end]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(limitsDoc, []byte(text[:begin+len(limitsBegin)]+want+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("the Limits table of %s is not what the protos declare; run: go test ./ctrl/bounds -run TestLimitsTable -update\nwant:\n%s", limitsDoc, want)
}

// limitsTable is one row per bounded field of every request, by service
// and method.
func limitsTable() string {
	var b strings.Builder
	b.WriteString("| Request | Field | Bound |\n|---|---|---|\n")
	for _, fd := range []protoreflect.FileDescriptor{ctrlv1.File_krane_ctrl_v1_ctrl_proto, ctrlv1.File_krane_ctrl_v1_fleet_proto, clusterv1.File_krane_cluster_v1_cluster_proto} {
		svcs := fd.Services()
		for i := range svcs.Len() {
			svc := svcs.Get(i)
			ms := svc.Methods()
			for j := range ms.Len() {
				m := ms.Get(j)
				rows := limitRows(m.Input(), "")
				for _, r := range rows {
					fmt.Fprintf(&b, "| %s.%s | `%s` | %s |\n", svc.Name(), m.Name(), r[0], r[1])
				}
			}
		}
	}
	return b.String()
}

// handlerLimits are the bounds a proto cannot declare, checked by the
// handler (the walking test sends a value past each).
var handlerLimits = map[protoreflect.FullName]string{
	"krane.cluster.v1.ReportStatusRequest.status": fmt.Sprintf("a built-in kind's status: the bounds of its message (below); another kind's: at most %d bytes as JSON", clusterapi.MaxGenericStatusBytes),
	"krane.ctrl.v1.Resource.spec":                 fmt.Sprintf("at most %d bytes as JSON, and the kind's schema", resourceapi.MaxSpecBytes),
}

func limitRows(md protoreflect.MessageDescriptor, prefix string) [][2]string {
	var out [][2]string
	fs := md.Fields()
	for i := range fs.Len() {
		f := fs.Get(i)
		path := prefix + string(f.Name())
		r := rulesOf(f)
		if h, ok := handlerLimits[f.FullName()]; ok {
			out = append(out, [2]string{path, h})
			if f.FullName() == "krane.cluster.v1.ReportStatusRequest.status" {
				for _, st := range []protoreflect.MessageDescriptor{
					(&clusterv1.DeploymentStatus{}).ProtoReflect().Descriptor(), (&clusterv1.SentinelStatus{}).ProtoReflect().Descriptor(),
					(&clusterv1.CiliumNetworkPolicyStatus{}).ProtoReflect().Descriptor(),
				} {
					out = append(out, limitRows(st, path+" ("+string(st.Name())+").")...)
				}
			}
			continue
		}
		if s := describe(f, r); s != "" {
			out = append(out, [2]string{path, s})
		}
		if f.Kind() == protoreflect.MessageKind && !f.IsMap() && !strings.HasPrefix(string(f.Message().FullName()), "google.protobuf.") {
			sub := path + "."
			if f.IsList() {
				sub = path + "[]."
			}
			out = append(out, limitRows(f.Message(), sub)...)
		}
	}
	return out
}

// describe words a field's declared rules.
func describe(f protoreflect.FieldDescriptor, r *validate.FieldRules) string {
	var parts []string
	switch {
	case f.IsMap():
		mr := r.GetMap()
		if mr.HasMaxPairs() {
			parts = append(parts, fmt.Sprintf("at most %d entries", mr.GetMaxPairs()))
		}
		if k := scalar(f.MapKey().Kind(), mr.GetKeys()); k != "" {
			parts = append(parts, "keys "+k)
		}
		if v := scalar(f.MapValue().Kind(), mr.GetValues()); v != "" {
			parts = append(parts, "values "+v)
		}
		if o, ok := f.Options().(*descriptorpb.FieldOptions); ok && o.GetDebugRedact() {
			parts = append(parts, "errors never name a key")
		}
	case f.IsList():
		rr := r.GetRepeated()
		if rr.HasMaxItems() {
			parts = append(parts, fmt.Sprintf("at most %d items", rr.GetMaxItems()))
		}
		if rr.GetItems().GetIgnore() == validate.Ignore_IGNORE_ALWAYS {
			parts = append(parts, "each checked on its own, refused in its result")
		} else if s := scalar(f.Kind(), rr.GetItems()); s != "" {
			parts = append(parts, "each "+s)
		}
	default:
		if s := scalar(f.Kind(), r); s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

// scalar words the rules of one value.
func scalar(kind protoreflect.Kind, r *validate.FieldRules) string {
	var parts []string
	switch kind {
	case protoreflect.StringKind:
		s := r.GetString()
		switch {
		case s.HasMinBytes() && s.HasMaxBytes():
			parts = append(parts, fmt.Sprintf("%d to %d bytes", s.GetMinBytes(), s.GetMaxBytes()))
		case s.HasMaxBytes():
			parts = append(parts, fmt.Sprintf("at most %d bytes", s.GetMaxBytes()))
		}
		if s.HasPattern() {
			parts = append(parts, "matching `"+s.GetPattern()+"`")
		}
		if in := s.GetIn(); len(in) > 0 {
			parts = append(parts, fmt.Sprintf("one of %q", in))
		}
	case protoreflect.BytesKind:
		if b := r.GetBytes(); b.HasMaxLen() {
			parts = append(parts, fmt.Sprintf("at most %d bytes", b.GetMaxLen()))
		}
	case protoreflect.EnumKind:
		if r.GetEnum().GetDefinedOnly() {
			parts = append(parts, "a defined value")
		}
	case protoreflect.Int32Kind:
		n := r.GetInt32()
		parts = append(parts, numRange(n.HasGte(), int64(n.GetGte()), n.HasLte(), int64(n.GetLte())))
	case protoreflect.Int64Kind:
		n := r.GetInt64()
		parts = append(parts, numRange(n.HasGte(), n.GetGte(), n.HasLte(), n.GetLte()))
	case protoreflect.Uint64Kind:
		if n := r.GetUint64(); n.HasLte() {
			parts = append(parts, fmt.Sprintf("at most %d", n.GetLte()))
		}
	case protoreflect.MessageKind:
		if ts := r.GetTimestamp(); ts.HasGte() && ts.GetGte().GetSeconds() == 0 {
			parts = append(parts, "not before 1970")
		}
		for _, c := range r.GetCel() {
			rule, _, _ := strings.Cut(c.GetMessage(), ":")
			parts = append(parts, "not "+rule)
		}
	}
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ", ")
}

func numRange(hasGte bool, gte int64, hasLte bool, lte int64) string {
	switch {
	case hasGte && hasLte:
		return fmt.Sprintf("%d to %d", gte, lte)
	case hasGte:
		return fmt.Sprintf("at least %d", gte)
	case hasLte:
		return fmt.Sprintf("at most %d", lte)
	}
	return ""
}
