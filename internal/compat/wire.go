package compat

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Buf is the pinned buf binary `make tools` installs.
func Buf(root string) (string, error) {
	p := filepath.Join(root, ".tools", "bin", "buf")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("buf not found at %s: run `make tools`", p)
	}
	return p, nil
}

// BufBreaking runs `buf breaking` on tree (a directory holding buf.yaml
// and the protocols, this repository's layout) against the tree of
// another release, with tree's rules (buf.yaml: WIRE_JSON), and returns
// what it reports.
func BufBreaking(ctx context.Context, buf, tree, against string) ([]string, error) {
	cmd := exec.CommandContext(ctx, buf, "breaking", "--against", against)
	cmd.Dir = tree
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil, nil
	}
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 100 { // buf: breaking changes found
		var found []string
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" {
				found = append(found, l)
			}
		}
		return found, nil
	}
	return nil, fmt.Errorf("buf breaking in %s against %s: %v\n%s", tree, against, err, out)
}

// Descriptors compiles a tree's protocols (buf build) into a registry.
func Descriptors(ctx context.Context, buf, tree string) (*protoregistry.Files, error) {
	out := filepath.Join(os.TempDir(), fmt.Sprintf("krane-compat-%d.binpb", os.Getpid()))
	defer os.Remove(out)
	cmd := exec.CommandContext(ctx, buf, "build", "--as-file-descriptor-set", "--exclude-source-info", "-o", out)
	cmd.Dir = tree
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("buf build in %s: %v\n%s", tree, err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	var set descriptorpb.FileDescriptorSet
	// The validate extension must be known to unmarshal the options into
	// typed rules.
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(data, &set); err != nil {
		return nil, err
	}
	return protodesc.NewFiles(&set)
}

// HostSent names the messages krane hosts send ctrl: the requests of
// krane.cluster.v1.ClusterService and every message they hold.
func HostSent(files *protoregistry.Files) ([]protoreflect.MessageDescriptor, error) {
	d, err := files.FindDescriptorByName("krane.cluster.v1.ClusterService")
	if err != nil {
		return nil, err
	}
	svc, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("krane.cluster.v1.ClusterService is a %T", d)
	}
	seen := map[protoreflect.FullName]bool{}
	var out []protoreflect.MessageDescriptor
	var walk func(m protoreflect.MessageDescriptor)
	walk = func(m protoreflect.MessageDescriptor) {
		if seen[m.FullName()] || strings.HasPrefix(string(m.FullName()), "google.protobuf.") {
			return
		}
		seen[m.FullName()] = true
		out = append(out, m)
		for i := 0; i < m.Fields().Len(); i++ {
			f := m.Fields().Get(i)
			if f.IsMap() {
				if v := f.MapValue().Message(); v != nil {
					walk(v)
				}
			} else if f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	for i := 0; i < svc.Methods().Len(); i++ {
		walk(svc.Methods().Get(i).Input())
	}
	return out, nil
}

// fieldRules is a field's buf.validate.field option, as a generic message
// (so that a tree's descriptors, not this binary's, decide its fields).
func fieldRules(f protoreflect.FieldDescriptor) protoreflect.Message {
	opts, ok := f.Options().(*descriptorpb.FieldOptions)
	if !ok || opts == nil || !proto.HasExtension(opts, validate.E_Field) {
		return nil
	}
	return proto.GetExtension(opts, validate.E_Field).(*validate.FieldRules).ProtoReflect()
}

// Tightening is a bound made stricter on a field hosts send.
type Tightening struct {
	Field  string // krane.cluster.v1.HeartbeatRequest.agent_version
	Rule   string // string.max_bytes
	Before string // "128", or "unset"
	After  string
}

func (t Tightening) String() string {
	return fmt.Sprintf("%s: %s %s -> %s", t.Field, t.Rule, t.Before, t.After)
}

// Tightenings compares the bounds of the fields krane hosts send between
// the baseline's descriptors and this tree's: a bound that refuses a value
// the baseline accepted (a lower maximum, a higher minimum, a rule that
// was not there) is reported. A field new in this tree is not: no host of
// the baseline sends it.
func Tightenings(base, cur *protoregistry.Files) ([]Tightening, error) {
	baseMsgs, err := HostSent(base)
	if err != nil {
		return nil, err
	}
	curMsgs, err := HostSent(cur)
	if err != nil {
		return nil, err
	}
	byName := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	for _, m := range curMsgs {
		byName[m.FullName()] = m
	}
	var out []Tightening
	for _, bm := range baseMsgs {
		cm, ok := byName[bm.FullName()]
		if !ok {
			continue // buf breaking reports a message that went
		}
		for i := 0; i < bm.Fields().Len(); i++ {
			bf := bm.Fields().Get(i)
			cf := cm.Fields().ByNumber(bf.Number())
			if cf == nil {
				continue
			}
			field := string(bm.FullName()) + "." + string(bf.Name())
			out = append(out, compareRules(field, "", fieldRules(bf), fieldRules(cf))...)
		}
	}
	slices.SortFunc(out, func(a, b Tightening) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

// maxLike rules bound from above (lowering one tightens), minLike from
// below; any other rule tightens when it is set anew or changed.
var (
	maxLike = map[string]bool{"max_len": true, "max_bytes": true, "max_items": true, "max_pairs": true, "lte": true, "lt": true}
	minLike = map[string]bool{"min_len": true, "min_bytes": true, "min_items": true, "min_pairs": true, "gte": true, "gt": true}
)

func compareRules(field, path string, before, after protoreflect.Message) []Tightening {
	if after == nil {
		return nil // no rule now: nothing refuses
	}
	if before == nil {
		before = dynamicpb.NewMessage(after.Descriptor())
	}
	var out []Tightening
	fields := after.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		name := path + string(f.Name())
		if !after.Has(f) {
			continue
		}
		av := after.Get(f)
		if f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() {
			var bv protoreflect.Message
			if before.Has(f) {
				bv = before.Get(f).Message()
			}
			out = append(out, compareRules(field, name+".", bv, av.Message())...)
			continue
		}
		was := "unset"
		if before.Has(f) {
			was = fmt.Sprint(before.Get(f).Interface())
		}
		now := fmt.Sprint(av.Interface())
		if f.IsList() {
			now = listString(av.List())
			if before.Has(f) {
				was = listString(before.Get(f).List())
			}
		}
		if was == now {
			continue
		}
		base := string(f.Name())
		switch {
		case maxLike[base] && before.Has(f) && numLess(av, before.Get(f)) == 0:
			continue // raised: looser
		case minLike[base] && before.Has(f) && numLess(av, before.Get(f)) > 0:
			continue // lowered: looser
		}
		out = append(out, Tightening{Field: field, Rule: name, Before: was, After: now})
	}
	return out
}

// numLess compares two scalar values: 1 when a < b, 0 when a > b, -1 when
// they are not comparable numbers.
func numLess(a, b protoreflect.Value) int {
	switch x := a.Interface().(type) {
	case int32:
		return boolInt(x < b.Interface().(int32))
	case int64:
		return boolInt(x < b.Interface().(int64))
	case uint32:
		return boolInt(x < b.Interface().(uint32))
	case uint64:
		return boolInt(x < b.Interface().(uint64))
	case float32:
		return boolInt(x < b.Interface().(float32))
	case float64:
		return boolInt(x < b.Interface().(float64))
	}
	return -1
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func listString(l protoreflect.List) string {
	parts := make([]string, l.Len())
	for i := range parts {
		parts[i] = fmt.Sprint(l.Get(i).Interface())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// AllowedTightenings reads internal/compat/tightenings.txt: bounds the
// policy lets tighten on fields hosts send, one per line as Tightening
// prints it, each followed by "  # why": every host release in the window
// sends within the new bound.
func AllowedTightenings(root string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(root, "internal", "compat", "tightenings.txt"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		entry, why, ok := strings.Cut(line, "#")
		if !ok || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("tightenings.txt: %q gives no reason (# why every host in the window sends within it)", line)
		}
		out[strings.TrimSpace(entry)] = strings.TrimSpace(why)
	}
	return out, sc.Err()
}
