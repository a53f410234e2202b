package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// resourceCmd holds what `ctrl resource` and `ctrl kind` share.
type resourceCmd struct {
	api  apiFlags
	poll time.Duration
}

// run is the RunE of a subcommand: clientRun for the ResourceService.
func (r *resourceCmd) run(body func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error) func(*cobra.Command, []string) error {
	return clientRun(&r.api, ctrlv1.NewResourceServiceClient, nil, body)
}

// call makes one API call, retried while ctrl is unavailable, and words
// its error for the terminal.
func call[T any](ctx context.Context, what string, fn func(context.Context) (T, error)) (T, error) {
	v, err := withRetry(ctx, fn)
	if err != nil {
		return v, resourceAPIError(what, err)
	}
	return v, nil
}

func newResourceCmd(use, short, long string) (*resourceCmd, *cobra.Command) {
	r := &resourceCmd{}
	cmd := &cobra.Command{Use: use, Short: short, Long: long}
	r.api.add(cmd)
	cmd.PersistentFlags().DurationVar(&r.poll, "poll-interval", 500*time.Millisecond, "how often --wait asks for progress")
	_ = cmd.PersistentFlags().MarkHidden("poll-interval")
	return r, cmd
}

func newKind() *cobra.Command {
	r, cmd := newResourceCmd("kind", "Register the kinds plugin authors add, with the JSON Schema of their spec",
		"Talks to ctrl's ResourceService with an operator token (CTRL_TOKEN) at CTRL_ADDR. A kind must be registered before "+
			"`ctrl resource apply` accepts its objects; every spec is checked against the kind's schema before it reaches a cluster.")
	cmd.AddCommand(r.kindRegister(), r.kindGet(), r.kindList())
	return cmd
}

func newResource() *cobra.Command {
	r, cmd := newResourceCmd("resource", "Publish, read and delete the desired state of plugin authors' kinds and ciliumnetworkpolicy",
		"Talks to ctrl's ResourceService with an operator token (CTRL_TOKEN) at CTRL_ADDR. An object is a kind, an id, the "+
			"regions it is desired in and its spec; every cluster of those regions receives it. With --wait a command follows "+
			"each region until its clusters report the new version applied, and fails with the cluster's error when one parks it.")
	cmd.AddCommand(r.apply(), r.get(), r.list(), r.delete())
	return cmd
}

func (r *resourceCmd) kindRegister() *cobra.Command {
	var schemaFile, describeFile, description string
	cmd := &cobra.Command{
		Use:   "register KIND --schema FILE | register --describe FILE",
		Short: "Register a kind with the JSON Schema of its spec (or every kind a plugin's --describe output publishes)",
		Long: "Register KIND with the JSON Schema (draft 2020-12) in FILE, or, with --describe, every kind in a plugin's " +
			"`--describe` output that publishes a spec schema (`krane-plugin-NAME --describe > plugin.json`). " +
			"Registering a kind again replaces its schema; objects already stored are not checked again.",
		Args: cobra.MaximumNArgs(1),
		RunE: r.run(func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error {
			var reqs []*ctrlv1.RegisterKindRequest
			var err error
			switch {
			case describeFile != "" && (schemaFile != "" || len(args) > 0):
				return errors.New("give either KIND --schema FILE or --describe FILE")
			case describeFile != "":
				if reqs, err = kindsFromDescribe(describeFile); err != nil {
					return err
				}
			case len(args) == 1 && schemaFile != "":
				schema, err := os.ReadFile(schemaFile)
				if err != nil {
					return fmt.Errorf("--schema: %w", err)
				}
				reqs = []*ctrlv1.RegisterKindRequest{{Kind: args[0], SpecSchema: string(schema), Description: description}}
			default:
				return errors.New("name the kind and its schema: `ctrl kind register KIND --schema FILE`, or `ctrl kind register --describe FILE` with a plugin's --describe output")
			}
			for _, req := range reqs {
				k, err := call(cmd.Context(), "register kind "+req.GetKind(), func(ctx context.Context) (*ctrlv1.KindInfo, error) { return api.RegisterKind(ctx, req) })
				if err != nil {
					return err
				}
				if format != "table" {
					if err := printAs(cmd.OutOrStdout(), format, k); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "kind %s registered\n", k.GetKind())
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&schemaFile, "schema", "", "file holding the JSON Schema of the kind's spec")
	cmd.Flags().StringVar(&describeFile, "describe", "", "a plugin's --describe output: register each kind it publishes a spec schema for")
	cmd.Flags().StringVar(&description, "description", "", "what the kind is, for `ctrl kind list`")
	return cmd
}

// kindsFromDescribe reads the kinds and spec schemas of a plugin's
// --describe output.
func kindsFromDescribe(path string) ([]*ctrlv1.RegisterKindRequest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--describe: %w", err)
	}
	var info struct {
		Name  string `json:"name"`
		Kinds []struct {
			Kind        string `json:"kind"`
			Description string `json:"description"`
			SpecSchema  string `json:"spec_schema"`
		} `json:"kinds"`
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("--describe %s is not a plugin's --describe output: %w", path, err)
	}
	var reqs []*ctrlv1.RegisterKindRequest
	for _, k := range info.Kinds {
		if k.SpecSchema != "" {
			reqs = append(reqs, &ctrlv1.RegisterKindRequest{Kind: k.Kind, SpecSchema: k.SpecSchema, Description: k.Description})
		}
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("plugin %q publishes no spec schema for its kinds in %s: register each with `ctrl kind register KIND --schema FILE`", info.Name, path)
	}
	return reqs, nil
}

func (r *resourceCmd) kindGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get KIND",
		Short: "Show a kind and its spec schema",
		Args:  cobra.ExactArgs(1),
		RunE: r.run(func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error {
			k, err := call(cmd.Context(), "get kind "+args[0], func(ctx context.Context) (*ctrlv1.KindInfo, error) {
				return api.GetKind(ctx, &ctrlv1.GetKindRequest{Kind: args[0]})
			})
			if err != nil {
				return err
			}
			if format != "table" {
				return printAs(cmd.OutOrStdout(), format, k)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "kind:        %s%s\ndescription: %s\nspec schema:\n", k.GetKind(), builtIn(k), or(k.GetDescription(), "-"))
			var pretty bytes.Buffer
			if json.Indent(&pretty, []byte(k.GetSpecSchema()), "  ", "  ") == nil {
				fmt.Fprintf(out, "  %s\n", pretty.String())
			} else {
				fmt.Fprintf(out, "  %s\n", k.GetSpecSchema())
			}
			return nil
		}),
	}
}

func builtIn(k *ctrlv1.KindInfo) string {
	if k.GetBuiltIn() {
		return " (built in)"
	}
	return ""
}

func (r *resourceCmd) kindList() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the kinds the resource API serves",
		Args:  cobra.NoArgs,
		RunE: r.run(func(cmd *cobra.Command, _ []string, format output, api ctrlv1.ResourceServiceClient) error {
			resp, err := call(cmd.Context(), "list kinds", func(ctx context.Context) (*ctrlv1.ListKindsResponse, error) {
				return api.ListKinds(ctx, &ctrlv1.ListKindsRequest{})
			})
			if err != nil {
				return err
			}
			if format != "table" {
				return printAs(cmd.OutOrStdout(), format, resp)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tREGISTERED\tDESCRIPTION")
			for _, k := range resp.GetKinds() {
				when := "built in"
				if !k.GetBuiltIn() {
					when = timestamp(k.GetCreatedAt().AsTime())
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", k.GetKind(), when, or(k.GetDescription(), "-"))
			}
			return w.Flush()
		}),
	}
}

// objectFile is one object as `ctrl resource apply` reads it.
type objectFile struct {
	Kind    string          `json:"kind"`
	ID      string          `json:"id"`
	Regions []string        `json:"regions"`
	Spec    json.RawMessage `json:"spec"`
}

// readObjects reads a file (or stdin for "-") of JSON or YAML: one object,
// a list of them, or several YAML documents.
func readObjects(path string, stdin io.Reader) ([]*ctrlv1.Resource, error) {
	var in io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(in, 4096)
	var out []*ctrlv1.Resource
	for doc := 1; ; doc++ {
		var raw any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d is neither JSON nor YAML: %w", path, doc, err)
		}
		items := []any{raw}
		if list, ok := raw.([]any); ok {
			items = list
		}
		for i, item := range items {
			if item == nil {
				continue
			}
			where := fmt.Sprintf("%s: document %d", path, doc)
			if len(items) > 1 {
				where += fmt.Sprintf(", item %d", i+1)
			}
			r, err := toResource(item)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no object (want kind, id, regions and spec)", path)
	}
	return out, nil
}

func toResource(item any) (*ctrlv1.Resource, error) {
	data, err := json.Marshal(item)
	if err != nil {
		return nil, err
	}
	var o objectFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("not an object of kind, id, regions and spec: %w", err)
	}
	if o.Kind == "" || o.ID == "" {
		return nil, errors.New("an object needs a kind and an id")
	}
	spec := &structpb.Struct{}
	if len(o.Spec) > 0 {
		if err := protojson.Unmarshal(o.Spec, spec); err != nil {
			return nil, fmt.Errorf("%s %s: spec is not a JSON object: %w", o.Kind, o.ID, err)
		}
	}
	return &ctrlv1.Resource{Kind: o.Kind, Id: o.ID, Regions: o.Regions, Spec: spec}, nil
}

func (r *resourceCmd) apply() *cobra.Command {
	var (
		file        string
		dryRun      bool
		wait        bool
		waitTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace objects from a JSON or YAML file (one object or a list); unchanged objects stay as they are",
		Long: "Puts every object of FILE (\"-\" reads stdin) in one transaction: each is a kind, an id, the regions it is desired in, " +
			"and its spec. ctrl checks each spec against its kind's schema first and refuses the whole file, naming the object and " +
			"the field, when one fails. An object applied again unchanged gets no new version, so applying a file twice is harmless. " +
			"A region an object no longer lists is deleted there. --dry-run validates and shows what would change.",
		Args: cobra.NoArgs,
		RunE: r.run(func(cmd *cobra.Command, _ []string, format output, api ctrlv1.ResourceServiceClient) error {
			if file == "" {
				return errors.New("name the file to apply: -f FILE (or -f - for stdin)")
			}
			objs, err := readObjects(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), "apply "+file, func(ctx context.Context) (*ctrlv1.PutResourcesResponse, error) {
				return api.PutResources(ctx, &ctrlv1.PutResourcesRequest{Resources: objs, DryRun: dryRun})
			})
			if err != nil {
				return err
			}
			err = show(cmd.OutOrStdout(), format, resp, func(out io.Writer) {
				for _, res := range resp.GetResults() {
					fmt.Fprintln(out, putLine(res, dryRun))
				}
			})
			if err != nil {
				return err
			}
			if !wait || dryRun {
				return nil
			}
			var targets []target
			for _, res := range resp.GetResults() {
				targets = append(targets, target{kind: res.GetKind(), id: res.GetId()})
			}
			return r.follow(cmd, api, targets, waitTimeout)
		}),
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "JSON or YAML file of objects (- for stdin)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate and show what would change, without writing")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every region's clusters report each object's version applied")
	cmd.Flags().DurationVar(&waitTimeout, "timeout", 5*time.Minute, "how long --wait waits")
	return cmd
}

// putLine is one object's outcome: "quota.acme.example/team-a created:
// local-a v12, local-b v13".
func putLine(res *ctrlv1.PutResult, dryRun bool) string {
	verb := res.GetOutcome()
	if dryRun && verb != "unchanged" {
		verb = "would be " + verb
	}
	var regions []string
	for _, c := range res.GetRegions() {
		switch {
		case c.GetChange() == "unchanged":
			regions = append(regions, c.GetRegion()+" unchanged")
		case dryRun:
			regions = append(regions, c.GetRegion()+" "+c.GetChange())
		default:
			regions = append(regions, fmt.Sprintf("%s %s v%d", c.GetRegion(), c.GetChange(), c.GetVersion()))
		}
	}
	return fmt.Sprintf("%s/%s %s: %s", res.GetKind(), res.GetId(), verb, strings.Join(regions, ", "))
}

func (r *resourceCmd) get() *cobra.Command {
	var wait bool
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "get KIND ID",
		Short: "Show an object: its spec and, per region, the version desired and applied, the latest status and apply errors",
		Args:  cobra.ExactArgs(2),
		RunE: r.run(func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error {
			if wait {
				if err := r.follow(cmd, api, []target{{kind: args[0], id: args[1]}}, waitTimeout); err != nil {
					return err
				}
			}
			info, err := r.getObject(cmd.Context(), api, args[0], args[1])
			if err != nil {
				return err
			}
			if format != "table" {
				return printAs(cmd.OutOrStdout(), format, info)
			}
			printObject(cmd.OutOrStdout(), info)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "first wait until every region's clusters report the object's version applied")
	cmd.Flags().DurationVar(&waitTimeout, "timeout", 5*time.Minute, "how long --wait waits")
	return cmd
}

func (r *resourceCmd) getObject(ctx context.Context, api ctrlv1.ResourceServiceClient, kind, id string) (*ctrlv1.ResourceInfo, error) {
	return call(ctx, fmt.Sprintf("get %s %s", kind, id), func(ctx context.Context) (*ctrlv1.ResourceInfo, error) {
		return api.GetResource(ctx, &ctrlv1.GetResourceRequest{Kind: kind, Id: id})
	})
}

func printObject(out io.Writer, info *ctrlv1.ResourceInfo) {
	res := info.GetResource()
	state := "desired in " + strings.Join(res.GetRegions(), ", ")
	if info.GetDeleted() {
		state = "deleted everywhere"
	}
	spec, _ := protojson.Marshal(res.GetSpec())
	fmt.Fprintf(out, "%s/%s: %s\nspec: %s\n", res.GetKind(), res.GetId(), state, compactJSON(spec))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "REGION\tVERSION\tAPPLIED\tSTATUS\tERROR")
	for _, rr := range info.GetRegions() {
		version := fmt.Sprintf("v%d", rr.GetVersion())
		if rr.GetDeleted() {
			version += " (deleted)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", rr.GetRegion(), version, appliedWord(rr), statusJSON(rr), errorWords(rr))
	}
	w.Flush()
}

func appliedWord(rr *ctrlv1.ResourceRegion) string {
	switch {
	case rr.GetApplied():
		return "yes"
	case rr.GetClustersCounted() == 0 && len(rr.GetClusters()) > 0:
		return "no live cluster"
	case rr.GetObservedVersion() == 0:
		return "not yet reported"
	}
	return fmt.Sprintf("no (reported v%d)", rr.GetObservedVersion())
}

func statusJSON(rr *ctrlv1.ResourceRegion) string {
	if n := rr.GetStatusOmittedBytes(); n > 0 {
		return fmt.Sprintf("(%d bytes, left out to keep the answer small)", n)
	}
	if rr.GetStatus() == nil {
		return "-"
	}
	b, _ := protojson.Marshal(rr.GetStatus())
	return compactJSON(b)
}

func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}

// errorWords summarises a region's apply errors: "cluster c1 parked v12:
// field cpu: not a quantity".
func errorWords(rr *ctrlv1.ResourceRegion) string {
	var out []string
	for _, e := range rr.GetErrors() {
		what := "retrying"
		if e.GetPermanent() {
			what = "parked"
		}
		out = append(out, fmt.Sprintf("cluster %s %s v%d: %s", e.GetClusterId(), what, e.GetVersion(), e.GetMessage()))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, "; ")
}

func (r *resourceCmd) list() *cobra.Command {
	var region string
	var all bool
	cmd := &cobra.Command{
		Use:   "list KIND",
		Short: "List the objects of a kind, with how many regions applied their version",
		Args:  cobra.ExactArgs(1),
		RunE: r.run(func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error {
			items, err := allPages(500, 0, func(size int32, token string) ([]*ctrlv1.ResourceInfo, string, error) {
				resp, err := call(cmd.Context(), "list "+args[0], func(ctx context.Context) (*ctrlv1.ListResourcesResponse, error) {
					return api.ListResources(ctx, &ctrlv1.ListResourcesRequest{Kind: args[0], Region: region, IncludeDeleted: all, PageSize: size, PageToken: token})
				})
				return resp.GetResources(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if format != "table" {
				return printAs(cmd.OutOrStdout(), format, &ctrlv1.ListResourcesResponse{Resources: items})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tREGIONS\tAPPLIED\tERRORS")
			for _, info := range items {
				applied, errs := 0, 0
				for _, rr := range info.GetRegions() {
					if rr.GetApplied() {
						applied++
					}
					errs += len(rr.GetErrors())
				}
				regions := strings.Join(info.GetResource().GetRegions(), ",")
				if info.GetDeleted() {
					regions = "(deleted)"
				}
				fmt.Fprintf(w, "%s\t%s\t%d/%d\t%d\n", info.GetResource().GetId(), regions, applied, len(info.GetRegions()), errs)
			}
			return w.Flush()
		}),
	}
	cmd.Flags().StringVar(&region, "region", "", "only objects desired (or deleted) in this region")
	cmd.Flags().BoolVar(&all, "all", false, "also objects deleted in every region")
	return cmd
}

func (r *resourceCmd) delete() *cobra.Command {
	var regions []string
	var wait bool
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "delete KIND ID",
		Short: "Delete an object (in every region, or in the --region ones): its clusters remove it",
		Args:  cobra.ExactArgs(2),
		RunE: r.run(func(cmd *cobra.Command, args []string, format output, api ctrlv1.ResourceServiceClient) error {
			resp, err := call(cmd.Context(), fmt.Sprintf("delete %s %s", args[0], args[1]), func(ctx context.Context) (*ctrlv1.DeleteResourceResponse, error) {
				return api.DeleteResource(ctx, &ctrlv1.DeleteResourceRequest{Kind: args[0], Id: args[1], Regions: regions})
			})
			if err != nil {
				return err
			}
			err = show(cmd.OutOrStdout(), format, resp, func(out io.Writer) {
				fmt.Fprintln(out, putLine(&ctrlv1.PutResult{Kind: args[0], Id: args[1], Outcome: "deleted", Regions: resp.GetRegions()}, false))
			})
			if err != nil {
				return err
			}
			if !wait {
				return nil
			}
			return r.follow(cmd, api, []target{{kind: args[0], id: args[1]}}, waitTimeout)
		}),
	}
	cmd.Flags().StringSliceVar(&regions, "region", nil, "delete only in this region (repeatable; default every region)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every region's clusters report the delete applied")
	cmd.Flags().DurationVar(&waitTimeout, "timeout", 5*time.Minute, "how long --wait waits")
	return cmd
}

// target is an object --wait follows.
type target struct{ kind, id string }

// follow waits until every region of every target reports its version
// applied, printing a progress line (to stderr) whenever a region's state
// changes. A change a cluster parked (a permanent error at the current
// version) ends the wait with that cluster's error: it will not apply
// without a new version.
func (r *resourceCmd) follow(cmd *cobra.Command, api ctrlv1.ResourceServiceClient, targets []target, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	out := cmd.ErrOrStderr()
	last := map[string]string{}
	begin := time.Now()
	for {
		done := true
		var parked, unserved []string
		for _, t := range targets {
			info, err := r.getObject(ctx, api, t.kind, t.id)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				return err
			}
			for _, rr := range info.GetRegions() {
				key := t.kind + "/" + t.id + " " + rr.GetRegion()
				line, p := regionProgress(rr)
				if last[key] != line {
					fmt.Fprintf(out, "%s: %s\n", key, line)
					last[key] = line
				}
				if p != "" {
					parked = append(parked, key+": "+p)
				}
				if !rr.GetApplied() {
					done = false
					if why := rr.GetNotServed(); why != "" {
						unserved = append(unserved, key+": "+why)
					}
				}
			}
		}
		if len(parked) > 0 {
			sort.Strings(parked)
			return &exitError{code: 1, err: fmt.Errorf("a cluster parked the change (it is retried only slowly, or when a new version arrives: fix the object and apply again):\n  %s", strings.Join(parked, "\n  "))}
		}
		if len(unserved) > 0 {
			// Nothing would apply it before a cluster there runs the kind:
			// waiting out the timeout would only hide why, as a deploy to
			// such a region is refused at once.
			sort.Strings(unserved)
			return &exitError{code: 1, err: fmt.Errorf("no live cluster can apply the change (it stays desired, and is applied when a cluster of the region runs a controller for the kind; see `ctrl admin cluster list`):\n  %s", strings.Join(unserved, "\n  "))}
		}
		if done && ctx.Err() == nil {
			fmt.Fprintf(out, "every region applied in %s\n", time.Since(begin).Round(100*time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			var waiting []string
			for key, line := range last {
				if !strings.HasPrefix(line, "applied") {
					waiting = append(waiting, key+": "+line)
				}
			}
			sort.Strings(waiting)
			return &exitError{code: 1, err: fmt.Errorf("not applied everywhere within %s (is the kind's plugin enabled in those regions' krane.hcl, and does it report status?):\n  %s",
				timeout, strings.Join(waiting, "\n  "))}
		case <-time.After(r.poll):
		}
	}
}

// regionProgress is one region's state for --wait, and the parked error
// of its current version, if any.
func regionProgress(rr *ctrlv1.ResourceRegion) (line, parked string) {
	what := "v" + fmt.Sprint(rr.GetVersion())
	if rr.GetDeleted() {
		what = "the delete (v" + fmt.Sprint(rr.GetVersion()) + ")"
	}
	for _, e := range rr.GetErrors() {
		if e.GetVersion() < rr.GetVersion() {
			continue // about an older version: the new one may fix it
		}
		msg := fmt.Sprintf("cluster %s cannot apply %s: %s", e.GetClusterId(), what, e.GetMessage())
		if e.GetPermanent() {
			return "parked: " + msg, msg
		}
		return "retrying: " + msg, ""
	}
	if rr.GetApplied() {
		return "applied " + what, ""
	}
	if rr.GetNotServed() != "" {
		return "not served: " + rr.GetNotServed(), ""
	}
	if rr.GetObservedVersion() == 0 {
		return "waiting for " + what + " (no cluster has reported yet)", ""
	}
	return fmt.Sprintf("waiting for %s (clusters report v%d)", what, rr.GetObservedVersion()), ""
}

// show prints m as JSON or YAML, or calls table for the table format.
func show(out io.Writer, format output, m proto.Message, table func(io.Writer)) error {
	if format != "table" {
		return printAs(out, format, m)
	}
	table(out)
	return nil
}

// resourceAPIError is apiError with what an old ctrl means here.
func resourceAPIError(what string, err error) error {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%s: this ctrl does not serve the resource API: upgrade it", what)
	}
	return apiError(what, err)
}
