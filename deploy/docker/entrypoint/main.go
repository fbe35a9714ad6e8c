// Command cart-entrypoint is the container entrypoint of the CART image:
// it checks the open-files limit and then execs the command it was given
// (cart, cart controlplane, cart dataplane, cartctl, cart-sim, ...).
//
// It is a static Go program rather than a shell script because the runtime
// image (distroless static, or scratch) has no shell: nothing in the image
// can run a script, and keeping it that way leaves no shell for an attacker.
//
// Why check here when cart checks too: cart's own check (server.min_open_files)
// explains the fix in systemd and ulimit terms and needs a config file; this
// one runs for every role, before any config is read, and names the container
// settings (docker --ulimit, compose ulimits, Kubernetes runtime limits) that
// are the fix inside a container.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// defaultMinOpenFiles matches config.example.yaml server.min_open_files: a
// router holding thousands of streams needs two descriptors per stream.
const defaultMinOpenFiles = 65535

// envMinOpenFiles overrides the threshold; 0 disables the check.
const envMinOpenFiles = "CART_MIN_OPEN_FILES"

// Exit codes follow the shell's conventions so that the container runtime
// reports the same status a shell entrypoint would have.
const (
	exitLimit    = 1   // limit too low
	exitUsage    = 64  // EX_USAGE: no command, bad CART_MIN_OPEN_FILES
	exitNotFound = 127 // command not found, as in sh
	exitNoExec   = 126 // found but could not be executed, as in sh
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// run returns only on failure: on success the process image is replaced.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "cart-entrypoint: no command given; usage: cart-entrypoint COMMAND [ARG...] (e.g. cart -c /etc/cart/cart.yaml)")
		return exitUsage
	}
	need, err := threshold(getenv(envMinOpenFiles))
	if err != nil {
		fmt.Fprintln(stderr, "cart-entrypoint:", err)
		return exitUsage
	}
	soft, hard, err := raiseLimit()
	if err != nil {
		fmt.Fprintln(stderr, "cart-entrypoint: read open-files limit:", err)
		return exitLimit
	}
	if need > 0 && soft < need {
		fmt.Fprint(stderr, limitMessage(soft, hard, need))
		return exitLimit
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "cart-entrypoint: %s: command not found (image binaries: cart, cartctl, cart-sim, cart-probe)\n", args[0])
		return exitNotFound
	}
	// Exec, not a child process: the command becomes PID 1's successor so it
	// receives SIGTERM from the runtime directly and its exit status is the
	// container's.
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(stderr, "cart-entrypoint: exec %s: %v\n", path, err)
	return exitNoExec
}

func threshold(raw string) (uint64, error) {
	if strings.TrimSpace(raw) == "" {
		return defaultMinOpenFiles, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a non-negative integer (0 disables the open-files check)", envMinOpenFiles, raw)
	}
	return n, nil
}

// raiseLimit lifts the soft RLIMIT_NOFILE to the hard limit, which any
// process may do, and returns the resulting limits. Runtimes commonly start
// containers with a low soft and a high hard limit (e.g. 1024:524288); only
// a hard limit below the threshold is a real problem.
//
// Setrlimit is called even when the Go runtime already raised the limit at
// start-up: the runtime restores the original soft limit on exec unless the
// program set the limit itself, and the exec'd command must inherit the
// raised one.
func raiseLimit() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		// Not fatal: report what we have and let the threshold decide.
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
			return lim.Cur, lim.Max, nil
		}
		return 0, 0, err
	}
	return raised.Cur, raised.Max, nil
}

func limitMessage(soft, hard, need uint64) string {
	return fmt.Sprintf(`cart-entrypoint: refusing to start: the open-files limit is %d (hard limit %d), below the required %d.
CART holds two sockets per streamed request and fails every new request once descriptors run out,
which is worse than not starting. Raise the limit for the container:
  docker run:      docker run --ulimit nofile=%d:%d ...
  docker compose:  ulimits: { nofile: { soft: %d, hard: %d } }
  Kubernetes:      pods inherit the container runtime's limit (there is no pod field); raise it on the
                   nodes, e.g. LimitNOFILE=%d in the containerd or CRI-O systemd unit, or
                   default_ulimits = ["nofile=%d:%d"] in crio.conf.
  systemd:         LimitNOFILE=%d
For tests only, lower the threshold with %s=<n> (0 disables the check) and set
server.min_open_files to match.
`, soft, hard, need, need, need, need, need, need, need, need, need, envMinOpenFiles)
}
