# CART — make help lists the targets.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/cartrouter/cart/cli/internal/buildinfo.Version=$(VERSION) -X github.com/cartrouter/cart/cli/internal/buildinfo.Commit=$(COMMIT)
BINARIES := cart cartctl cart-sim
GOFILES = $(shell git ls-files '*.go' | grep -v '^gen/')

.PHONY: help build run run-cluster test lint fmt-check vet staticcheck fuzz bench clean tools generate checkgenerate deploy-tools deploy-check bench-micro bench-quality bench-cp bench-failover

# Code generation and lint tools, pinned and built from the Go module proxy
# into .tools/ once (buf's remote plugins are never used).
TOOLS := $(CURDIR)/.tools
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.19.2
STATICCHECK_VERSION := v0.8.2
HELM_VERSION := v3.22.0
# A go-installed helm assumes Kubernetes 1.20, below the chart's kubeVersion.
HELM_KUBE_VERSION := 1.30.0

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: $(addprefix bin/,$(BINARIES)) ## build bin/cart, bin/cartctl, bin/cart-sim

# One target per binary, so that run and run-cluster build only what they
# start; go build itself skips what is up to date.
.PHONY: $(addprefix bin/,$(BINARIES))
$(addprefix bin/,$(BINARIES)):
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $@ ./cli/$(notdir $@)

run: bin/cart bin/cart-sim ## start three cart-sim replicas and cart on :6700 (Ctrl-C stops all); SPLIT=1: two prefill + two decode replicas
	@SPLIT=$(SPLIT) deploy/local/run.sh

run-cluster: bin/cart bin/cart-sim ## three control-plane nodes, two data planes, HAProxy on :6700, three cart-sim replicas; files in tmp/cluster (Ctrl-C stops all)
	@deploy/local/cluster.sh

test: fmt-check vet staticcheck ## the one test command: format, vet, staticcheck, go test -race
	HELM=$(TOOLS)/helm $(GO) test -race -count=1 -timeout 25m ./...

lint: fmt-check vet staticcheck ## format, vet and staticcheck only

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# vet and staticcheck build the packages as go test -race does, so that on
# a cold build cache make test compiles every package once, not twice: vet +
# staticcheck + compiling the race test binaries took 1270 s instead of
# 2140 s (fresh GOCACHE, loaded 2-core box). The !race files left unchecked
# only define raceEnabled.
LINT_GOFLAGS := -race

vet:
	$(GO) vet $(LINT_GOFLAGS) ./...

staticcheck: $(TOOLS)/staticcheck
	GOFLAGS="$$GOFLAGS $(LINT_GOFLAGS)" $(TOOLS)/staticcheck ./...

FUZZTIME ?= 30s
fuzz: ## run every fuzz target for FUZZTIME each
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

bench: build bin/cart-bench ## side-by-side suite (nginx rr/least_conn, CART all-in-one, 1/2/4 data planes, split, proxy overhead, control plane, failover) -> bench/results/<date>/; BENCH_FULL=1 for whole traces
	bin/cart-bench suite

bench-cp: build bin/cart-bench ## control plane alone: Route load on three nodes (open 1k/2k/5k/s, closed c=32)
	bin/cart-bench cp

bench-failover: build bin/cart-bench ## leader kill under load: hit ratio of the window containing it, errors, time to the new leader
	bin/cart-bench failover

.PHONY: bin/cart-bench
bin/cart-bench: ## the load generator and benchmark suite (not part of the image)
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/cart-bench ./cli/cart-bench

bench-micro: ## micro-benchmarks of the routing path
	$(GO) test -run XXX -bench . -benchmem ./controlplane/index ./controlplane/engine ./dataplane/extract

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-connect-go $(TOOLS)/staticcheck ## install pinned buf, protoc plugins and staticcheck into .tools/

$(TOOLS)/buf:
	GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(TOOLS)/protoc-gen-connect-go:
	GOBIN=$(TOOLS) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

generate: tools ## buf lint + regenerate gen/ from proto/ with local plugins
	PATH="$(TOOLS):$$PATH" buf lint
	PATH="$(TOOLS):$$PATH" buf generate

checkgenerate: generate ## fail when gen/ is stale
	@test -z "$$(git status --porcelain -- gen/)" || { echo "gen/ is stale: run make generate and commit"; git status --porcelain -- gen/; exit 1; }

deploy-tools: $(TOOLS)/helm ## install pinned helm into .tools/
$(TOOLS)/helm:
	GOBIN=$(TOOLS) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

deploy-check: deploy-tools ## lint and test deploy/ (Dockerfile, compose, Helm, systemd, dashboard, alerts)
	$(TOOLS)/helm lint --strict --kube-version $(HELM_KUBE_VERSION) deploy/helm/cart
	shellcheck -s sh deploy/docker/build.sh
	promtool check config deploy/prometheus/prometheus.yml
	promtool test rules deploy/prometheus/alerts_test.yml
	CI=true HELM=$(TOOLS)/helm $(GO) test -count=1 ./deploy/...

clean:
	rm -rf bin

QUALITY_OUT ?= bench/results/$(shell date -u +%F)-quality
bench-quality: build bin/cart-bench ## routing-quality mechanisms side by side: mooncake conversation, and llm-d shared prefix with replica capacity swept
	bin/cart-bench suite --no-overhead --no-controlplane --no-failover --traces mooncake_conversation \
		--scenarios nginx-lc,cart-plain,cart-capacity,cart-closedloop,cart-hot,cart-all,cart-events --out $(QUALITY_OUT)/mooncake
	for c in 1228800 307200 153600 102400 76800; do \
		bin/cart-bench suite --no-overhead --no-controlplane --no-failover --traces llmd_shared_prefix_73pct_blk512 --cache-tokens $$c \
			--scenarios nginx-lc,precise,cart-plain,cart-capacity,cart-closedloop,cart-all,cart-events --out $(QUALITY_OUT)/llmd-$$c || exit 1; \
	done
