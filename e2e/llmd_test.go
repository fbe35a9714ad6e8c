package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
)

// llmdSimEnv names an llm-d-inference-sim binary built from source
// (github.com/llm-d/llm-d-inference-sim; it is not built here: CI does not
// have it, and the test skips without it).
const llmdSimEnv = "CART_LLMD_INFERENCE_SIM"

// CART's split requests against llm-d-inference-sim, a second opinion on
// the protocol: any of its instances serves a prefill leg (kv_transfer_params
// do_remote_decode: a non-streamed answer with finish_reason remote_decode
// and transfer parameters) and a decode leg (do_remote_prefill: its first
// token after --kv-cache-transfer-latency), so two of them make a split
// pool. It binds every interface and has no flag to bind loopback, so the
// test runs in a network namespace of its own.
func TestPDWithLLMDInferenceSim(t *testing.T) {
	bin := os.Getenv(llmdSimEnv)
	if bin == "" {
		t.Skip(llmdSimEnv + " is not set: build llm-d-inference-sim from source and name the binary there to run this test")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("%s=%s: %v", llmdSimEnv, bin, err)
	}
	if !testkit.InOwnNetns(t, 5*time.Minute) {
		return
	}
	cartBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart")
	for _, mode := range []string{"all-in-one", "distributed"} {
		t.Run(mode, func(t *testing.T) {
			sims := startLLMDSims(t, bin)
			base := pdRouter(t, mode, cartBin, sims)
			const n = 8
			res := runPD(base, n, 2, -1, nil)
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("request %d: %v", i, r.err)
				}
				if r.prefill != sims[0].url || r.decode != sims[1].url || r.chunks < 2 {
					t.Fatalf("request %d: prefill %q decode %q, %d events", i, r.prefill, r.decode, r.chunks)
				}
			}
			prefills := metricOr0(t, sims[0].url, `vllm:request_success_total{finish_reason="remote_decode",model_name="cart-sim"}`)
			// Its random answers end by length or by an early stop.
			decodes := metricOr0(t, sims[1].url, `vllm:request_success_total{finish_reason="length",model_name="cart-sim"}`) +
				metricOr0(t, sims[1].url, `vllm:request_success_total{finish_reason="stop",model_name="cart-sim"}`)
			t.Logf("%s: %d split requests; the prefill instance finished %v with remote_decode, the decode instance %v", mode, n, prefills, decodes)
			if prefills != n || decodes != n {
				t.Fatalf("prefill legs %v, decode legs %v, want %d each", prefills, decodes, n)
			}
			waitRouterIdle(t, base)
		})
	}
}

// startLLMDSims starts a prefill and a decode llm-d-inference-sim.
func startLLMDSims(t *testing.T, bin string) []*simProc {
	t.Helper()
	var out []*simProc
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		addr := testkit.FreeAddr(t)
		port := addr[strings.LastIndexByte(addr, ':')+1:]
		if _, err := strconv.Atoi(port); err != nil {
			t.Fatal(addr)
		}
		s := &simProc{name: "llmd-" + role, role: role, url: "http://" + addr}
		s.Proc = proc.Start(t, proc.Cmd{Name: s.name, Path: bin, Args: []string{"--port", port, "--model", "cart-sim",
			"--force-dummy-tokenizer", "--max-model-len", "32768", "--max-num-seqs", "16",
			"--time-to-first-token", "5ms", "--inter-token-latency", "10ms", "--kv-cache-transfer-latency", "20ms"}})
		out = append(out, s)
	}
	for _, s := range out {
		s.WaitFor(t, 30*time.Second, "serving", proc.HTTPOK(s.url+"/v1/models"))
	}
	return out
}

func metricOr0(t *testing.T, base, series string) float64 {
	t.Helper()
	v, _, err := testkit.MetricSample(plain, base+"/metrics", series)
	if err != nil {
		t.Fatalf("%s/metrics: %v", base, err)
	}
	return v
}
