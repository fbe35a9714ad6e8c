package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
)

// TestSDKsAuthenticateWithClientKeys: the official SDKs, configured the way
// their users configure them (an API key), authenticate to a cart with
// client keys: openai-go sends "Authorization: Bearer", anthropic-sdk-go
// sends "x-api-key". A wrong key surfaces as each SDK's own authentication
// error, because the 401 body is in the shape that SDK parses.
func TestSDKsAuthenticateWithClientKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the cart binary; skipped with -short")
	}
	cartBin, _ := buildBinaries(t)
	rep := newReplica(t, sim.Config{Name: "auth", BlockTokens: 16, OutputTokens: 4})
	dir := t.TempDir()
	const key = "e2e-client-key-7d1f0a9c"
	keyFile := filepath.Join(dir, "client-key")
	writeFile(t, keyFile, key+"\n")
	n := &httpNode{id: "aio-auth", addr: testkit.FreeAddr(t)}
	_, port, _ := net.SplitHostPort(n.addr)
	cfg := filepath.Join(dir, "cart.yaml")
	writeFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}
log: {level: warn, format: text}
health: {interval_secs: 0.5, timeout_secs: 0.4}
workers: [{url: %q}]
auth:
  client_keys: [{name: sdk-tests, key_file: %q}]
`, port, rep.url, keyFile))
	n.Proc = proc.Start(t, proc.Cmd{Name: n.id, Path: cartBin, Args: []string{"-c", cfg}})
	n.WaitFor(t, 20*time.Second, "/health", proc.HTTPOK(n.url()+"/health"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	oa := func(apiKey string) openai.Client {
		return openai.NewClient(option.WithBaseURL(n.url()+"/v1/"), option.WithAPIKey(apiKey),
			option.WithMaxRetries(0), option.WithRequestTimeout(10*time.Second))
	}
	good, bad := oa(key), oa("wrong-key")
	if _, err := good.Chat.Completions.New(ctx, chatParams("hello with a key", 4)); err != nil {
		t.Fatalf("openai-go with the client key: %v", err)
	}
	_, err := bad.Chat.Completions.New(ctx, chatParams("hello with a wrong key", 4))
	var oerr *openai.Error
	if !errors.As(err, &oerr) || oerr.StatusCode != http.StatusUnauthorized || oerr.Type != "authentication_error" {
		t.Fatalf("openai-go with a wrong key: %v, want a 401 openai.Error of type authentication_error", err)
	}

	an := func(apiKey string) anthropic.Client {
		return anthropic.NewClient(anthropicopt.WithoutEnvironmentDefaults(), anthropicopt.WithBaseURL(n.url()),
			anthropicopt.WithAPIKey(apiKey), anthropicopt.WithMaxRetries(0), anthropicopt.WithRequestTimeout(10*time.Second))
	}
	params := anthropic.MessageNewParams{
		Model:     "cart-sim",
		MaxTokens: 4,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
	}
	agood, abad := an(key), an("wrong-key")
	if _, err := agood.Messages.New(ctx, params); err != nil {
		t.Fatalf("anthropic-sdk-go with the client key (x-api-key): %v", err)
	}
	_, err = abad.Messages.New(ctx, params)
	var aerr *anthropic.Error
	if !errors.As(err, &aerr) || aerr.StatusCode != http.StatusUnauthorized || aerr.Type() != anthropic.ErrorTypeAuthenticationError {
		t.Fatalf("anthropic-sdk-go with a wrong key: %v, want a 401 anthropic.Error of type authentication_error", err)
	}
}
