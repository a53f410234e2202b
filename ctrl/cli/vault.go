package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/vault"
)

// secretEnvFrom collects the secret variables of `deploy create`: the
// files first, then --secret-env (which wins). A KEY without '=' takes its
// value from lookup (the command's environment). Errors name variables and
// lines, never values.
func secretEnvFrom(files, pairs []string, lookup func(string) (string, bool)) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range files {
		vars, err := readDotenv(f)
		if err != nil {
			return nil, err
		}
		for k, v := range vars {
			out[k] = v
		}
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			if v, ok = lookup(k); !ok {
				return nil, fmt.Errorf("--secret-env %s: no '=' and no variable %s in this command's environment", k, k)
			}
		}
		if k == "" {
			return nil, errors.New("--secret-env: want KEY=VALUE or KEY")
		}
		if seen[k] {
			return nil, fmt.Errorf("--secret-env %s is given twice", k)
		}
		seen[k], out[k] = true, v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// readDotenv reads KEY=VALUE lines: blank lines and # comments are skipped,
// a leading `export ` is allowed, a value may be 'single quoted' (taken as
// is) or "double quoted" (with \n, \t, \", \\ escapes), and an unquoted
// value ends at " #".
func readDotenv(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--secret-env-file: %w", err)
	}
	defer clear(data)
	return parseDotenv(data, "--secret-env-file "+path)
}

// parseDotenv parses the lines of readDotenv; what names the source in
// errors ("--secret-env-file F"), which name lines and variables, never
// values.
func parseDotenv(data []byte, what string) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, raw, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		where := fmt.Sprintf("%s, line %d", what, n)
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("%s: want KEY=VALUE", where)
		}
		if !validVarName(k) {
			// Never quoted: a malformed line (a ':' for the '=') puts
			// the value where the name should be.
			return nil, fmt.Errorf("%s: the text before '=' is not a variable name (letters, digits and '_', not starting with a digit, at most %d)", where, maxVarName)
		}
		v, err := dotenvValue(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %v", where, k, err)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: %s is set twice in the file", where, k)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func dotenvValue(raw string) (string, error) {
	switch {
	case strings.HasPrefix(raw, "'"):
		end := strings.Index(raw[1:], "'")
		if end < 0 {
			return "", errors.New("unterminated single quote")
		}
		if rest := strings.TrimSpace(raw[end+2:]); rest != "" && !strings.HasPrefix(rest, "#") {
			return "", errors.New("text after the closing quote")
		}
		return raw[1 : end+1], nil
	case strings.HasPrefix(raw, `"`):
		var b strings.Builder
		for i := 1; i < len(raw); i++ {
			c := raw[i]
			switch {
			case c == '"':
				if rest := strings.TrimSpace(raw[i+1:]); rest != "" && !strings.HasPrefix(rest, "#") {
					return "", errors.New("text after the closing quote")
				}
				return b.String(), nil
			case c == '\\' && i+1 < len(raw):
				i++
				switch raw[i] {
				case 'n':
					b.WriteByte('\n')
				case 't':
					b.WriteByte('\t')
				case 'r':
					b.WriteByte('\r')
				default:
					b.WriteByte(raw[i])
				}
			default:
				b.WriteByte(c)
			}
		}
		return "", errors.New("unterminated double quote")
	}
	if i := strings.Index(raw, " #"); i >= 0 {
		raw = strings.TrimSpace(raw[:i])
	}
	return raw, nil
}

func newVault() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vault",
		Short: "The keyring that seals deployments' secret variables: create it, rotate it, read its audit",
		Long: "ctrl seals secret variables with a data key per deployment, wrapped by the newest key of the keyring file " +
			"(vault.keyring_file); every key in the file still opens what it sealed. The file holds raw keys: keep it mode 0600, " +
			"back it up, and never remove a key while a deployment sealed with it may run. A running ctrl reloads the file when it changes.",
	}
	var file string
	cmd.PersistentFlags().StringVar(&file, "keyring-file", "", "the keyring file (default: vault.keyring_file of the configuration)")
	keyringFile := func(cmd *cobra.Command) (string, error) {
		if file != "" {
			return file, nil
		}
		cfg, err := serve.LoadConfig(cmd.Flags())
		if err != nil {
			return "", err
		}
		if cfg.Vault.KeyringFile == "" {
			return "", errors.New("no keyring file: pass --keyring-file, or set vault.keyring_file (CTRL_VAULT_KEYRING_FILE)")
		}
		return cfg.Vault.KeyringFile, nil
	}
	initCmd := &cobra.Command{
		Use:   "init --keyring-file F",
		Short: "Create a keyring file (mode 0600) with one fresh key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := keyringFile(cmd)
			if err != nil {
				return err
			}
			key, err := vault.Init(path, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s with key %s\n", path, key.ID)
			fmt.Fprintln(cmd.ErrOrStderr(), "Back this file up: sealed secrets cannot be opened without it. Point ctrl at it with vault.keyring_file.")
			return nil
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate --keyring-file F",
		Short: "Add a fresh key to the keyring; it seals from now on, the older keys keep opening",
		Long: "Appends a new random key to the keyring file, replacing the file atomically; no key is changed or removed. " +
			"A file readable by anyone but its owner is refused. When ctrl reads the keyring from a Kubernetes Secret, rotate a " +
			"local copy and update the Secret from it; ctrl picks the change up when the volume is refreshed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := keyringFile(cmd)
			if err != nil {
				return err
			}
			key, err := vault.Rotate(path, time.Now())
			if err != nil {
				return err
			}
			f, err := vault.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added key %s to %s (%d keys); new secrets are sealed with it\n", key.ID, path, len(f.Keys))
			return nil
		},
	}
	var deployment, sentinel string
	var limit int
	audit := &cobra.Command{
		Use:   "audit [--deployment D | --sentinel S]",
		Short: "List decryption requests of clusters, newest first (allowed, denied, failed)",
		Long: "Every DecryptEnv request of a cluster: for a deployment's secret variables, or (an id sen_...) for a " +
			"sentinel's credentials. The DEPLOYMENT column holds the id the cluster asked for.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if deployment != "" && sentinel != "" {
				return errors.New("--deployment and --sentinel: pass one of them")
			}
			if sentinel != "" {
				deployment = sentinel // one column holds the id asked for
			}
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			entries, err := st.VaultAudit(cmd.Context(), deployment, limit)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TIME\tDEPLOYMENT\tREGION\tCLUSTER\tTOKEN\tOUTCOME\tREASON")
			for _, e := range entries {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.Format(time.RFC3339), e.DeploymentID, e.Region, e.ClusterID, e.TokenID, e.Outcome, e.Reason)
			}
			return w.Flush()
		},
	}
	audit.Flags().StringVar(&deployment, "deployment", "", "only this deployment's requests")
	audit.Flags().StringVar(&sentinel, "sentinel", "", "only this sentinel's requests (its credentials)")
	audit.Flags().IntVar(&limit, "limit", 100, "at most this many entries")
	cmd.AddCommand(initCmd, rotate, audit)
	return cmd
}
