package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreZMQPubWriter)
}

// parse runs the command with a stand-in serve func and returns what it
// would have served.
func parse(t *testing.T, args ...string) (string, sim.Config, error) {
	t.Helper()
	listen, _, cfg, err := parseAll(t, args...)
	return listen, cfg, err
}

func parseAll(t *testing.T, args ...string) (string, kvevents.PublisherConfig, sim.Config, error) {
	t.Helper()
	var gotListen string
	var gotKV kvevents.PublisherConfig
	var gotCfg sim.Config
	cmd := newCommand(func(_ context.Context, listen string, kv kvevents.PublisherConfig, cfg sim.Config, _ io.Writer) error {
		gotListen, gotKV, gotCfg = listen, kv, cfg
		return nil
	})
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.ExecuteContext(context.Background())
	return gotListen, gotKV, gotCfg, err
}

func TestFlagsMapToConfig(t *testing.T) {
	listen, cfg, err := parse(t,
		"--listen", "127.0.0.1:18001", "--name", "a", "--cache-tokens", "4096",
		"--block-tokens", "32", "--prefill-us-per-token", "20", "--decode-ms-per-token", "2.5",
		"--decode-slowdown", "0.1", "--max-concurrency", "4", "--model", "m",
		"--output-tokens", "64", "--seed", "7", "--time-scale", "0.5",
		"--models", "m,m-alias", "--lora-modules", "sql=/adapters/sql", "--lora-modules", "chat=/adapters/chat",
		"--no-cache-details", "--stored-responses", "5",
		"--pd-role", "decode", "--kv-transfer-ms", "2", "--kv-transfer-us-per-token", "7.5", "--kv-hold-secs", "30")
	if err != nil {
		t.Fatal(err)
	}
	want := sim.Config{
		Name: "a", Model: "m", CacheTokens: 4096, BlockTokens: 32,
		PrefillUsPerToken: 20, DecodeMsPerToken: 2.5, DecodeSlowdown: 0.1,
		MaxConcurrency: 4, OutputTokens: 64, Seed: 7, TimeScale: 0.5,
		Models:         []string{"m", "m-alias"},
		LoRAModules:    []sim.LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat"}},
		NoCacheDetails: true, StoredResponses: 5,
		Role: "decode", KVTransferMs: 2, KVTransferUsPerToken: 7.5, KVHoldSecs: 30,
	}
	if listen != "127.0.0.1:18001" || !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %s %+v\nwant %+v", listen, cfg, want)
	}
}

func TestDefaults(t *testing.T) {
	listen, cfg, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	want := sim.DefaultConfig()
	want.Name = "sim-8001"
	if listen != "127.0.0.1:8001" || !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %s %+v\nwant %+v", listen, cfg, want)
	}
}

func TestInvalidFlagsAreRejected(t *testing.T) {
	for _, args := range [][]string{
		{"--max-concurrency", "-1"},
		{"--cache-tokens", "4"},
		{"--output-tokens", "5000"},
		{"--time-scale", "-2"},
		{"--models", "a,a"},
		{"--model", "x", "--models", "a,b"},
		{"--lora-modules", "nopath"},
		{"--lora-modules", "a=/p", "--models", "a"},
		{"--stored-responses", "-1"},
		{"--pd-role", "both"},
		{"--kv-transfer-us-per-token", "-1"},
		{"--kv-events-encoding", "json", "--kv-events-endpoint", "tcp://127.0.0.1:1"},
		{"--kv-events-topic", "t"},
		{"--kv-events-replay-endpoint", "tcp://127.0.0.1:2"},
		{"unexpected-arg"},
	} {
		if _, _, err := parse(t, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestServeListenerServesAndStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := sim.DefaultConfig()
	cfg.Name = "cli-test"
	cfg.TimeScale = 0
	var logs strings.Builder
	done := make(chan error, 1)
	go func() { done <- serveListener(ctx, ln, nil, cfg, &logs) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object string `json:"object"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || out.Object != "chat.completion" || resp.Header.Get("X-Sim-Replica") != "cli-test" {
		t.Fatalf("response %d %+v %v", resp.StatusCode, out, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestNameFromListen(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8002": "sim-8002",
		"127.0.0.1:0":    sim.DefaultName,
		"garbage":        sim.DefaultName,
	} {
		if got := nameFromListen(listen); got != want {
			t.Errorf("nameFromListen(%q) = %q, want %q", listen, got, want)
		}
	}
}

func TestKVEventFlags(t *testing.T) {
	_, kv, cfg, err := parseAll(t, "--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-replay-endpoint", "tcp://127.0.0.1:5558",
		"--kv-events-topic", "kv@sim@m", "--kv-events-encoding", "array", "--kv-events-connect")
	want := kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", Topic: "kv@sim@m", Encoding: kvevents.EncodingArray, Connect: true}
	if err != nil || !reflect.DeepEqual(kv, want) || cfg.KVEvents != nil {
		t.Fatalf("got %+v %v", kv, err)
	}
	if _, kv, _, err := parseAll(t); err != nil || kv.Endpoint != "" || kv.Encoding != kvevents.EncodingMap {
		t.Fatalf("default %+v %v", kv, err)
	}
	if err := serve(context.Background(), "127.0.0.1:0", kvevents.PublisherConfig{Endpoint: "bogus://x"}, sim.Config{}, io.Discard); err == nil {
		t.Fatal("a bad KV events endpoint was accepted")
	}
}
