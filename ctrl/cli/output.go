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
