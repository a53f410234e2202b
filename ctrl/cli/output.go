package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// output is the one -o vocabulary of every command that prints a result:
// table (for people), json (protobuf JSON) or yaml (the same document as
// YAML). "text", the old name of table, is still accepted (not advertised).
type output string

const (
	outTable output = "table"
	outJSON  output = "json"
	outYAML  output = "yaml"
)

const outputUsage = "output format: table, json (protobuf JSON) or yaml"

// parseOutput checks an -o value.
func parseOutput(s string) (output, error) {
	switch s {
	case "table", "text", "":
		return outTable, nil
	case "json":
		return outJSON, nil
	case "yaml":
		return outYAML, nil
	}
	return "", fmt.Errorf("--output %q: want table, json or yaml", s)
}

// addOutputFlag adds -o to fs's command, into v.
func addOutputFlag(cmd *cobra.Command, v *string, persistent bool) {
	fs := cmd.Flags()
	if persistent {
		fs = cmd.PersistentFlags()
	}
	fs.StringVarP(v, "output", "o", string(outTable), outputUsage)
}

// structured is whether o prints documents rather than a table.
func (o output) structured() bool { return o != outTable }

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  "}

// printAs prints m as protobuf JSON or as YAML (a "---" document, so a
// stream of them, as --wait prints, is a YAML stream).
func printAs(out io.Writer, format output, m proto.Message) error {
	if format != outYAML {
		b, err := jsonOut.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "---\n%s", y)
	return err
}

// connect dials ctrl with f and returns the service client newClient
// makes and a closer: the one way every API command reaches ctrl.
func connect[C any](f *apiFlags, newClient func(grpc.ClientConnInterface) C) (C, func(), error) {
	conn, err := f.dial()
	if err != nil {
		var zero C
		return zero, nil, err
	}
	return newClient(conn), func() { conn.Close() }, nil
}

// clientRun is the RunE of every command that is a client of one of ctrl's
// services: the -o format checked; then prepare (the command's own checks
// of its arguments, flags and files; nil for none), before anything is
// dialled, so that a bad value or a secret on the command line never
// reaches the network; then a client connected (closed afterwards) and
// body.
func clientRun[C any](f *apiFlags, newClient func(grpc.ClientConnInterface) C, prepare func(*cobra.Command, []string) error,
	body func(cmd *cobra.Command, args []string, format output, api C) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		format, err := f.format()
		if err != nil {
			return err
		}
		if prepare != nil {
			if err := prepare(cmd, args); err != nil {
				return err
			}
		}
		api, closeConn, err := connect(f, newClient)
		if err != nil {
			return err
		}
		defer closeConn()
		return body(cmd, args, format, api)
	}
}

// allPages gathers a listing's pages: page asks for up to size items after
// token and returns them with the next token ("" after the last page).
// limit > 0 stops after that many items; pageSize is the most one page
// asks for.
func allPages[T any](pageSize, limit int32, page func(size int32, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for limit <= 0 || int32(len(all)) < limit {
		size := pageSize
		if limit > 0 {
			size = min(size, limit-int32(len(all)))
		}
		items, next, err := page(size, token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if token = next; token == "" {
			break
		}
	}
	return all, nil
}
