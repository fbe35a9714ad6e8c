// Command cartctl is the operator's client for a CART control plane: it
// manages the worker set and the Raft cluster through the AdminService and
// asks the RouterService what it would decide for a given prompt.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/cli/internal/buildinfo"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run executes cartctl with args and returns the process exit code. The
// environment is passed in as a function so tests can run many
// invocations side by side without touching the process environment.
func run(args []string, stdout, stderr io.Writer, env func(string) string) int {
	return execute(args, os.Stdin, stdout, stderr, env)
}

// execute is run with an explicit stdin, for `route --text -`.
func execute(args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, env: env}
	root := a.newRoot()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "cartctl: %s\n", oneLine(message(err)))
	code := exitCode(err)
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// message is err for people. Calls report through rpcError, which knows
// the server; a bare connect error is one cartctl made up itself (e.g. a
// worker missing from the list update read) and gets the same wording.
func message(err error) string {
	if _, ok := errors.AsType[*rpcError](err); ok {
		return err.Error()
	}
	if _, ok := errors.AsType[*connect.Error](err); ok {
		return describe(attempt{err: err}, 0)
	}
	return err.Error()
}

// oneLine keeps error reports to a single line, which is what log
// scrapers and `2>&1 | tail -1` in scripts expect, even when a wrapped
// error (e.g. from a YAML parser) spans several.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// app holds what every command needs: the standard streams, the
// environment and the global flags. Settings are resolved per command,
// only by the commands that talk to the control plane, so that `version`,
// `help` and `completion` work even with a broken config file.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	env            func(string) string
	flags          globalFlags
}

const exitCodesHelp = `Exit codes (stable; scripts may rely on them):
  0  success
  1  any other error
  2  usage error: bad flags, arguments or settings (also when the server
     rejects an argument as invalid)
  3  not found (worker or cluster member)
  4  already exists (a worker with other settings; use 'workers update')
  5  not the leader, or the cluster has no leader; when the server names
     the leader, the message says where it is
  6  unauthenticated or permission denied (check --token / CARTCTL_TOKEN)
  7  control plane unavailable: connection refused, unreachable or timed out
     (a write that timed out after reaching a server may still be applied)
  8  write outcome unknown: the server appended the change but lost
     leadership before it knew whether it committed; it may still take
     effect. Commands are idempotent: run the same command again until it
     exits 0 or with a definite error

A write is done (0), unknown (8, or a 7 that timed out after reaching a
server) or not done (any other code). Repeating a write is always safe.`

func (a *app) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "cartctl",
		Short: "Manage a CART control plane: workers, Raft cluster, routing decisions",
		Long: `cartctl talks to a CART control plane over its Connect (gRPC) API.

Settings come from, highest precedence first: flags, environment variables
(CARTCTL_SERVER, CARTCTL_TOKEN, CARTCTL_TOKEN_FILE, CARTCTL_TLS_CA,
CARTCTL_TLS_CERT, CARTCTL_TLS_KEY, CARTCTL_TLS_SERVER_NAME, CARTCTL_TIMEOUT,
CARTCTL_OUTPUT, CARTCTL_INSECURE), the config file, then defaults. The config file is
--config, else $CARTCTL_CONFIG, else $XDG_CONFIG_HOME/cartctl/config.yaml
(normally $HOME/.config/cartctl/config.yaml) when it exists. It is YAML with
the keys server, token, token_file, tls_ca, tls_cert, tls_key,
tls_server_name, timeout, output and insecure; unknown keys are an error.

--server may list several control-plane URLs separated by commas; they are
tried in order while a server is unreachable or unavailable.

A token is never sent over plain http:// to a host other than loopback
unless --insecure is given; a token file, or a config file holding a token,
that other local users can read is warned about.

` + exitCodesHelp,
		Version:       buildinfo.String("cartctl"),
		SilenceUsage:  true,
		SilenceErrors: true,
		// Args and RunE make unknown subcommands a usage error (exit 2)
		// instead of cobra's help-and-exit-0 for nested commands.
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	// cobra's default completion command prints help and exits 0 for an
	// unknown shell; ours is a usage error like everything else.
	root.CompletionOptions.DisableDefaultCmd = true
	a.flags.register(root)
	root.AddCommand(a.workersCmd(), a.clusterCmd(), a.routeCmd(), a.queueCmd(), versionCmd(), completionCmd())
	return root
}

// groupRunE serves commands that only group subcommands: alone they print
// help; followed by anything else it is an unknown subcommand.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default, applied lazily by cobra
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	return usagef("%s", msg)
}

// checkArgs turns cobra's positional-argument errors into usage errors.
func checkArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return &usageError{err}
		}
		return nil
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the cartctl version",
		Args:  checkArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), buildinfo.String("cartctl"))
			return err
		},
	}
}

func completionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Generate a shell completion script",
		Long: `Generate a shell completion script and print it to stdout.

  bash:        source <(cartctl completion bash)
  zsh:         cartctl completion zsh > "${fpath[1]}/_cartctl"
  fish:        cartctl completion fish > ~/.config/fish/completions/cartctl.fish
  powershell:  cartctl completion powershell | Out-String | Invoke-Expression`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args:      checkArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			default:
				return root.GenPowerShellCompletionWithDesc(out)
			}
		},
	}
}
