// Command cart-probe checks a CART endpoint from inside the CART image, for
// container health checks and Kubernetes init containers.
//
// The runtime image has no shell, curl or wget (see deploy/README.md), so a
// compose healthcheck or an init container that must loop until a condition
// holds needs a program of its own. Kubernetes probes do not use it: the
// kubelet's httpGet and grpc probes need nothing in the image.
//
//	cart-probe http  URL        GET URL; healthy on 2xx (data plane, all-in-one, cart-sim: /health)
//	cart-probe grpc  URL        grpc.health.v1.Health/Check; healthy on SERVING (control plane API:
//	                            SERVING once the node knows a Raft leader)
//	cart-probe workers URL      AdminService.ListWorkers; healthy when at least one worker is registered
//
// With -wait D it retries every -interval until healthy or D has passed
// (init containers); without it, it checks once (health checks). The bearer
// token for workers comes from -token-file, CARTCTL_TOKEN or CART_TOKEN.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

const usage = `usage: cart-probe [flags] http|grpc|workers URL
  http URL      GET URL (e.g. http://127.0.0.1:6700/health); healthy on 2xx
  grpc URL      gRPC health of a control plane API (e.g. http://127.0.0.1:6701); healthy on SERVING
  workers URL   control plane API URL; healthy when at least one worker is registered
flags:
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

type options struct {
	timeout   time.Duration
	wait      time.Duration
	interval  time.Duration
	tokenFile string
	caFile    string
	service   string
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cart-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var o options
	fs.DurationVar(&o.timeout, "timeout", 3*time.Second, "time allowed for one check")
	fs.DurationVar(&o.wait, "wait", 0, "retry until healthy for up to this long (0: check once)")
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "pause between checks with -wait")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (default: $CARTCTL_TOKEN, then $CART_TOKEN)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM CA bundle for https URLs (default: system roots)")
	fs.StringVar(&o.service, "service", "", "service name for grpc checks (default: the whole server)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return 2
	}
	kind, target := fs.Arg(0), strings.TrimRight(fs.Arg(1), "/")
	client, err := httpClient(o.caFile)
	if err != nil {
		fmt.Fprintln(stderr, "cart-probe:", err)
		return 2
	}
	var check func(context.Context) (string, error)
	switch kind {
	case "http":
		check = func(ctx context.Context) (string, error) { return checkHTTP(ctx, client, fs.Arg(1)) }
	case "grpc":
		check = func(ctx context.Context) (string, error) { return checkGRPCHealth(ctx, client, target, o.service) }
	case "workers":
		token, err := readToken(o.tokenFile, getenv)
		if err != nil {
			fmt.Fprintln(stderr, "cart-probe:", err)
			return 2
		}
		check = func(ctx context.Context) (string, error) { return checkWorkers(ctx, client, target, token) }
	default:
		fs.Usage()
		return 2
	}
	deadline := time.Now().Add(o.wait)
	for {
		cctx, cancel := context.WithTimeout(ctx, o.timeout)
		msg, err := check(cctx)
		cancel()
		if err == nil {
			fmt.Fprintf(stdout, "cart-probe: %s %s: %s\n", kind, target, msg)
			return 0
		}
		if o.wait <= 0 || time.Now().Add(o.interval).After(deadline) {
			fmt.Fprintf(stderr, "cart-probe: %s %s: %v\n", kind, target, err)
			return 1
		}
		fmt.Fprintf(stderr, "cart-probe: %s %s: %v; retrying in %s\n", kind, target, err, o.interval)
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(o.interval):
		}
	}
}

// httpClient speaks HTTP/1.1 and, for https, HTTP/2; checkGRPCHealth
// adds cleartext HTTP/2 for gRPC.
func httpClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // a probe of a local or in-cluster address must not go through an egress proxy
	if caFile != "" {
		pool, err := config.CertPool(caFile)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &http.Client{Transport: tr}, nil
}

func readToken(file string, getenv func(string) string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read token: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			// An empty mount must not silently mean "no auth" (same rule as cart).
			return "", fmt.Errorf("token file %s is empty", file)
		}
		return tok, nil
	}
	if tok := getenv("CARTCTL_TOKEN"); tok != "" {
		return strings.TrimSpace(tok), nil
	}
	return strings.TrimSpace(getenv("CART_TOKEN")), nil
}

func checkHTTP(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("status %s", resp.Status)
	}
	return resp.Status, nil
}

// checkGRPCHealth calls grpc.health.v1.Health/Check over gRPC, the same
// call the kubelet's grpc probe makes, so a compose healthcheck and a
// Kubernetes readiness probe agree. gRPC needs HTTP/2: cleartext URLs use
// h2c with prior knowledge, which the control plane serves.
func checkGRPCHealth(ctx context.Context, client *http.Client, base, service string) (string, error) {
	h2 := *client
	tr := client.Transport.(*http.Transport).Clone()
	var protos http.Protocols
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true)
	tr.Protocols = &protos
	h2.Transport = tr
	resp, err := grpchealth.NewClient(&h2, base, connect.WithGRPC(), connect.WithReadMaxBytes(cpclient.MaxAnswerBytes)).Check(ctx, &grpchealth.CheckRequest{Service: service})
	if err != nil {
		return "", err
	}
	if resp.Status != grpchealth.StatusServing {
		return "", fmt.Errorf("health status %s (a control plane serves once it knows a Raft leader)", resp.Status)
	}
	return resp.Status.String(), nil
}

func checkWorkers(ctx context.Context, client *http.Client, base, token string) (string, error) {
	c := cartv1connect.NewAdminServiceClient(client, base, connect.WithReadMaxBytes(cpclient.MaxAnswerBytes), connect.WithInterceptors(cpclient.Bearer(token)))
	resp, err := c.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		return "", err
	}
	n := len(resp.Msg.GetWorkers())
	if n == 0 {
		return "", errors.New("no workers registered yet")
	}
	return fmt.Sprintf("%d worker(s) registered", n), nil
}
