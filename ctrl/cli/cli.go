// Package cli is the `ctrl` command line: serve, migrate, the
// administration of clusters, operator tokens and the Restate registration
// (these read the same configuration as `ctrl serve`: flags, CTRL_*
// variables, --config), and `ctrl deploy`, `ctrl sentinel`, `ctrl
// rollout`, `ctrl kind` and `ctrl resource`, clients of the operators' APIs
// (CTRL_ADDR, CTRL_TOKEN).
package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/sdk/telemetry"
	"krane.dev/shared/version"
)

// NewRoot returns the `ctrl` command. Other parts of ctrl add their command
// groups (deploy, sentinel, rollout) with AddCommand.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ctrl",
		Short:         "Krane's control plane: desired state for every cluster, served to krane agents",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	serve.AddConfigFlag(root.PersistentFlags())
	serve.AddFlags(root.PersistentFlags(), func(key string) bool { return key == "db.dsn" })
	root.AddCommand(newServe(), newAdmin(), newDeploy(), newRestate(), newVault())
	root.AddCommand(newSentinel(), newRollout(), newFleet(), newKind(), newResource(), newEnvironment())
	// The spellings from before `ctrl admin` (ctrl migrate, ctrl cluster
	// ..., ctrl token ..., ctrl db ...) still work, hidden from help, for
	// one release (docs/operating.md, "Setting up ctrl").
	for _, old := range []*cobra.Command{newMigrate(), newCluster(), newToken(), newDB()} {
		old.Hidden = true
		root.AddCommand(old)
	}
	return root
}

// newAdmin groups the commands that go straight to ctrl's database (they
// need db.dsn, like `ctrl serve`, and no operator token): the schema
// migrations, clusters, API tokens and the database's generation. The other
// commands are clients of ctrl's API.
func newAdmin() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Administration through ctrl's database (needs db.dsn, not a token): migrate, clusters, API tokens, db",
	}
	cmd.AddCommand(newMigrate(), newCluster(), newToken(), newDB())
	return cmd
}

// Main runs the command line and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "ctrl: %v\n", err)
		var coded interface{ ExitCode() int } // an outcome with its own status (e.g. a paused rollout)
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}

func newServe() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the ClusterService (gRPC) and /healthz, /readyz, /metrics (HTTP)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serve.LoadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := serve.NewLogger(cfg.Log, cmd.ErrOrStderr())
			flush, err := telemetry.Setup(cmd.Context(), "krane-ctrl", telemetry.Options{})
			if err != nil {
				return err
			}
			defer flushTraces(flush)
			srv, err := serve.Start(cmd.Context(), cfg, log, serve.Deps{})
			if err != nil {
				return err
			}
			return srv.Wait()
		},
	}
	serve.AddFlags(cmd.Flags(), func(key string) bool { return key != "db.dsn" })
	return cmd
}

// openStore opens the configured database; needCurrent refuses a database
// whose schema is behind (with the command that fixes it).
func openStore(cmd *cobra.Command, needCurrent bool) (*store.Store, error) {
	cfg, err := serve.LoadConfig(cmd.Flags())
	if err != nil {
		return nil, err
	}
	if cfg.DB.DSN == "" {
		return nil, errors.New("no database configured: pass --db-dsn, set CTRL_DB_DSN, or name a --config file with db.dsn")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, cfg.DB.DSN, store.PoolOptions{MaxOpenConns: 4})
	if err != nil {
		return nil, err
	}
	if needCurrent {
		ok, err := st.MigrationsCurrent(ctx)
		if err != nil {
			st.Close()
			return nil, err
		}
		if !ok {
			st.Close()
			return nil, errors.New("the database schema is not current: run `ctrl admin migrate` first")
		}
	}
	return st, nil
}

func newMigrate() *cobra.Command {
	var plan bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending schema migrations (safe to run from several places at once); --plan shows them first",
		Long: `Apply the schema migrations this ctrl carries that the database lacks, one at a
time in version order. Each is an expand step (additive: replicas of the
previous release keep working while it runs) or a contract step (removes
what the previous release no longer reads; it needs the ctrl line it
names, and older replicas stop serving, saying why, before it runs).
See docs/compatibility.md. --plan lists what would run and changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, false)
			if err != nil {
				return err
			}
			defer st.Close()
			out := cmd.OutOrStdout()
			if plan {
				return printMigrationPlan(cmd, st)
			}
			lastReport := time.Time{}
			applied, err := st.MigrateReporting(cmd.Context(), store.MigrateReport{
				Starting: func(m store.PlannedMigration) {
					fmt.Fprintf(out, "applying %s (%s)...\n", m.Name, phaseWord(m.Phase))
				},
				// A backfill reports every few seconds, not every batch.
				Backfill: func(name string, p store.BackfillProgress) {
					if time.Since(lastReport) >= 5*time.Second || p.Done >= p.Total {
						lastReport = time.Now()
						fmt.Fprintf(out, "  %s: %d of %d rows filled (%d batches)\n", name, p.Done, p.Total, p.Batches)
					}
				},
			})
			for _, m := range applied {
				fmt.Fprintf(out, "applied %s (version %d) in %s\n", m.Source, m.Version, m.Duration.Round(time.Millisecond))
			}
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(out, "schema is current; nothing to apply")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&plan, "plan", false, "list the migrations that would run, expand or contract, and change nothing")
	return cmd
}

// printMigrationPlan writes what `ctrl admin migrate` would apply.
func printMigrationPlan(cmd *cobra.Command, st *store.Store) error {
	plan, err := st.MigrationPlan(cmd.Context())
	if err != nil {
		return err
	}
	status, err := st.SchemaStatus(cmd.Context())
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if len(status.Ahead) > 0 {
		fmt.Fprintf(out, "The database also holds %d migrations of a newer release than this ctrl (%s).\n", len(status.Ahead), version.Version)
	}
	if len(plan) == 0 {
		fmt.Fprintln(out, "schema is current; nothing to apply")
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tMIGRATION\tPHASE\tWHAT IT MEANS FOR RUNNING REPLICAS")
	for _, m := range plan {
		note := "replicas of the previous release keep working"
		switch m.Phase {
		case store.Contract:
			note = fmt.Sprintf("completes %05d; replicas older than ctrl %s stop serving (they say why)", m.Contracts, m.RequiresCtrl)
		case "":
			note = "from before phases were declared: apply with every replica of this release or later"
		}
		fmt.Fprintf(w, "%05d\t%s\t%s\t%s\n", m.Version, m.Name, phaseWord(m.Phase), note)
	}
	return w.Flush()
}

func phaseWord(p store.Phase) string {
	if p == "" {
		return "undeclared"
	}
	return string(p)
}

// readClusterList reads `REGION CLUSTER` lines from a file (or standard
// input for "-").
func readClusterList(cmd *cobra.Command, path string) ([]auth.ClusterRef, error) {
	r := cmd.InOrStdin()
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("cluster list: %w", err)
		}
		defer f.Close()
		r = f
	}
	var refs []auth.ClusterRef
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: %q: want `REGION CLUSTER`", path, n, line)
		}
		refs = append(refs, auth.ClusterRef{Region: f[0], ClusterID: f[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("%s lists no clusters (want `REGION CLUSTER` lines)", path)
	}
	return refs, nil
}

func newCluster() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Register clusters, revoke their tokens, remove them, list them"}

	var region, cluster, registerExpires, from string
	register := &cobra.Command{
		Use:   "register (--region R --cluster C | --from FILE)",
		Short: "Register a cluster (or many) and print each new token once",
		Long: "Register a cluster in a region and print a new cluster token on stdout. " +
			"ctrl stores only the token's hash: copy it into the cluster's krane configuration now, it cannot be shown again. " +
			"Registering an existing cluster again adds a token (for rotation); revoke the old one afterwards (`ctrl admin token revoke ID`). " +
			"With --expires-in the token stops working after that long, and the cluster's open streams are closed then.\n\n" +
			"With --from FILE (- for standard input), register every cluster the file lists, one per line as `REGION CLUSTER` " +
			"(blank lines and lines starting with # are skipped), in one transaction: all of them or, on any error, none. " +
			"Standard output then has one `CLUSTER TOKEN` line per cluster, in the file's order.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case from != "" && (region != "" || cluster != ""):
				return errors.New("--from registers the clusters its file lists: leave out --region and --cluster")
			case from == "" && (region == "" || cluster == ""):
				return errors.New("give --region and --cluster for one cluster, or --from FILE for many")
			}
			var refs []auth.ClusterRef
			if from != "" {
				var err error
				if refs, err = readClusterList(cmd, from); err != nil {
					return err
				}
			}
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			opts, until, err := expiryOptions(registerExpires)
			if err != nil {
				return err
			}
			if from == "" {
				token, err := auth.RegisterCluster(cmd.Context(), st, region, cluster, opts...)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), token)
				fmt.Fprintf(cmd.ErrOrStderr(), "Registered cluster %s in region %s; its token %s. It went to stdout and is shown only once: ctrl keeps just its hash.\n",
					cluster, region, until)
				return nil
			}
			begin := time.Now()
			tokens, err := auth.RegisterClusters(cmd.Context(), st, refs, opts...)
			if err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			w := bufio.NewWriter(cmd.OutOrStdout())
			for i, ref := range refs {
				fmt.Fprintf(w, "%s %s\n", ref.ClusterID, tokens[i])
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Registered %d clusters from %s in %s; each token %s. They went to stdout and are shown only once: ctrl keeps just their hashes.\n",
				len(refs), from, time.Since(begin).Round(time.Millisecond), until)
			return nil
		},
	}
	register.Flags().StringVar(&region, "region", "", "region the cluster serves")
	register.Flags().StringVar(&cluster, "cluster", "", "cluster id, unique across regions")
	register.Flags().StringVar(&from, "from", "", "file listing clusters to register, one `REGION CLUSTER` per line (- for standard input)")
	register.Flags().StringVar(&registerExpires, "expires-in", "", expiresInUsage)

	var revokeID string
	var revokeWait time.Duration
	revoke := &cobra.Command{
		Use:   "revoke --cluster C",
		Short: "Revoke every token of a cluster; its open streams end at once on every ctrl",
		Long: "Revoke every valid token of a cluster. Every ctrl refuses calls with them and closes the cluster's open streams " +
			"within its auth.revocation_poll_interval (default 250ms); the command returns once every replica has (up to --wait). To revoke one token (say, the old one after a rotation), use `ctrl admin token revoke ID`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := st.RevokeClusterTokens(cmd.Context(), revokeID)
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no cluster %q is registered (see `ctrl admin cluster list`)", revokeID)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %d token(s) of cluster %s\n", n, revokeID)
			if n > 0 {
				return waitRevocationsRead(cmd, st, revokeWait)
			}
			return nil
		},
	}
	revoke.Flags().StringVar(&revokeID, "cluster", "", "cluster id (required)")
	revoke.Flags().DurationVar(&revokeWait, "wait", 10*time.Second, "how long to wait for every ctrl replica to refuse the tokens before returning (it fails, naming them, if some did not)")
	_ = revoke.MarkFlagRequired("cluster")

	remove := &cobra.Command{
		Use:   "remove CLUSTER",
		Short: "Remove a cluster: revoke its tokens, close its streams, delete what it reported; it no longer shows or holds deploys back",
		Long: "Remove a registered cluster, in one transaction: every token of it is revoked (every ctrl closes its open streams within " +
			"auth.revocation_poll_interval and refuses it from then on), its reported state (status reports, instances, apply errors) " +
			"is deleted, and it leaves `ctrl admin cluster list`, the console and every rule that waits on a region's clusters: a deploy to " +
			"its region no longer waits for it. The removal is recorded with who did it (`ctrl admin cluster audit`). " +
			"Registering the same id again later makes a new cluster. The API call is FleetService.RemoveCluster.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			r, err := st.RemoveCluster(cmd.Context(), args[0], "ctrl cluster remove (database)")
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no cluster %q is registered (see `ctrl admin cluster list`)", args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed cluster %s of region %s: %d token(s) revoked; %d reports, %d instances, %d apply errors deleted\n",
				r.ID, r.Region, r.TokensRevoked, r.Reports, r.Instances, r.ApplyErrors)
			if r.TokensRevoked > 0 {
				return waitRevocationsRead(cmd, st, 10*time.Second)
			}
			return nil
		},
	}

	var auditLimit int
	audit := &cobra.Command{
		Use:   "audit [CLUSTER]",
		Short: "List cluster removals, newest first: who removed which cluster, when, and what went with it",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			entries, err := st.ClusterAudit(cmd.Context(), id, auditLimit)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "WHEN\tCLUSTER\tREGION\tACTION\tBY\tDETAIL")
			for _, e := range entries {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.ClusterID, e.Region, e.Action, e.Actor, e.Detail)
			}
			return w.Flush()
		},
	}
	audit.Flags().IntVar(&auditLimit, "limit", 100, "entries to show at most")

	var listRegion, listOutput string
	list := &cobra.Command{
		Use:   "list [--region R] [-o table|json|yaml]",
		Short: "List clusters: tokens, heartbeat, controllers and versions, per kind lag (versions and seconds), parked objects (as `ctrl fleet list`)",
		Long:  fleetListLong + "\n\nThis command reads ctrl's database (like `cluster register`); `ctrl fleet list` prints the same through ctrl's API with an operator token.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := parseOutput(listOutput)
			if err != nil {
				return err
			}
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			resp, err := fleetapi.Load(cmd.Context(), st, listRegion)
			if err != nil {
				return fmt.Errorf("read the fleet: %w", err)
			}
			return printFleet(cmd, resp, listRegion, format)
		},
	}
	list.Flags().StringVar(&listRegion, "region", "", "only this region's clusters")
	addOutputFlag(list, &listOutput, false)
	cmd.AddCommand(register, revoke, remove, audit, list)
	return cmd
}

func newToken() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "API tokens: create operator tokens, list and revoke any token"}
	var name, expires string
	var revokeWait time.Duration
	create := &cobra.Command{
		Use:   "create-operator --name N",
		Short: "Create an operator token and print it once",
		Long: "Create a token for the operator APIs (deploy, sentinel, rollout) and print it on stdout, once: ctrl keeps just its hash. " +
			"With --expires-in it stops working after that long.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			opts, until, err := expiryOptions(expires)
			if err != nil {
				return err
			}
			token, err := auth.CreateOperatorToken(cmd.Context(), st, name, opts...)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			fmt.Fprintf(cmd.ErrOrStderr(), "Created operator token %q; it %s. It went to stdout and is shown only once: ctrl keeps just its hash.\n", name, until)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "whose token this is, e.g. a person or a pipeline (required)")
	create.Flags().StringVar(&expires, "expires-in", "", expiresInUsage)
	_ = create.MarkFlagRequired("name")

	var listCluster string
	var listValid bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List tokens (cluster and operator): id, owner, created, expires, revoked; never a secret",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			toks, err := st.ListTokens(cmd.Context())
			if err != nil {
				return err
			}
			now := time.Now()
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tKIND\tCLUSTER/NAME\tREGION\tCREATED\tEXPIRES\tREVOKED")
			for _, t := range toks {
				if listCluster != "" && t.ClusterID != listCluster || listValid && !t.Valid(now) {
					continue
				}
				owner, region := t.Name, "-"
				if t.Kind == store.ClusterToken {
					owner, region = t.ClusterID, t.Region
				}
				expiresCol := "never"
				if !t.ExpiresAt.IsZero() {
					expiresCol = timestamp(t.ExpiresAt)
					if t.Expired(now) {
						expiresCol += " (expired)"
					}
				}
				revokedCol := "-"
				if t.Revoked() {
					revokedCol = timestamp(t.RevokedAt)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, owner, region, timestamp(t.CreatedAt), expiresCol, revokedCol)
			}
			return w.Flush()
		},
	}
	list.Flags().StringVar(&listCluster, "cluster", "", "only this cluster's tokens")
	list.Flags().BoolVar(&listValid, "valid", false, "only tokens that are neither revoked nor expired")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke one token (cluster or operator); its open streams end at once on every ctrl",
		Long: "Revoke the token with this id (the ID column of `ctrl admin token list`; it is also the part after krane_c_ or krane_o_ in the token). " +
			"Every ctrl refuses calls with it and closes its open streams within auth.revocation_poll_interval (default 250ms); the command returns once " +
			"every ctrl replica reading the database has done so (up to --wait).",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("name the token to revoke: `ctrl admin token revoke ID` (ids are in the first column of `ctrl admin token list`)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if p, err := auth.Parse(id); err == nil { // a whole token was pasted: use its id, never echo it
				id = p.ID
			}
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			tok, revokedNow, err := st.RevokeToken(cmd.Context(), id)
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no token has the id %q (`ctrl admin token list` shows the ids)", id)
			}
			if err != nil {
				return err
			}
			who := "operator token " + tok.ID + " (" + tok.Name + ")"
			if tok.Kind == store.ClusterToken {
				who = "cluster token " + tok.ID + " (cluster " + tok.ClusterID + ", region " + tok.Region + ")"
			}
			if !revokedNow {
				fmt.Fprintf(cmd.OutOrStdout(), "%s was already revoked at %s\n", who, timestamp(tok.RevokedAt))
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", who)
			return waitRevocationsRead(cmd, st, revokeWait)
		},
	}
	revoke.Flags().DurationVar(&revokeWait, "wait", 10*time.Second, "how long to wait for every ctrl replica to refuse the token before returning (it fails, naming them, if some did not)")
	cmd.AddCommand(create, list, revoke)
	return cmd
}

const expiresInUsage = "the token stops working this long after it is created, e.g. 12h, 90d or 1d12h (at least 1s; default: never)"

// expiryOptions turns --expires-in into token options and a phrase saying
// until when the token is valid.
func expiryOptions(flag string) ([]auth.TokenOption, string, error) {
	if flag == "" {
		return nil, "never expires (revoke it with `ctrl admin token revoke ID`)", nil
	}
	d, err := parseExpiresIn(flag)
	if err != nil {
		return nil, "", err
	}
	return []auth.TokenOption{auth.ExpiresIn(d)}, "expires at " + timestamp(time.Now().Add(d)), nil
}

// maxExpiresIn bounds --expires-in.
const maxExpiresIn = 10 * 365 * 24 * time.Hour

// parseExpiresIn reads a Go duration, optionally led by a number of days
// ("30d", "1d12h").
func parseExpiresIn(s string) (time.Duration, error) {
	bad := fmt.Errorf("--expires-in %q is not a duration: use e.g. 90s, 12h, 90d or 1d12h", s)
	var d time.Duration
	rest := s
	if days, after, ok := strings.Cut(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 100000 { // beyond that, days overflow a Duration
			return 0, bad
		}
		d, rest = time.Duration(n)*24*time.Hour, after
	}
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil {
			return 0, bad
		}
		d += min(r, maxExpiresIn+1) // no overflow: both parts are bounded
	}
	switch {
	case d < time.Second:
		return 0, fmt.Errorf("--expires-in %s is too short: at least 1s (leave it out for a token that never expires)", s)
	case d > maxExpiresIn:
		return 0, fmt.Errorf("--expires-in %s is longer than 10 years; leave it out for a token that never expires", s)
	}
	return d, nil
}

func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
