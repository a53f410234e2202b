# Krane: build, test, demo, proto, lint, deps, testenv, bench, deploy-check.
# Every target works on a fresh machine: what it needs is installed or built
# here (Go tools through the module proxy, Restate from npm, the Kubernetes
# test binaries from source, MariaDB from Debian packages).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

GO        ?= go
# The release, or the development version of the next one (scripts/version.sh).
VERSION   ?= $(shell ./scripts/version.sh 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X krane.dev/shared/version.Version=$(VERSION)
TOOLS_BIN := $(CURDIR)/.tools/bin
STAMPS    := $(CURDIR)/.tools/stamps
export PATH := $(TOOLS_BIN):$(PATH)

# Pinned tool versions (generated code records them in its header).
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION        := v0.8.2
CYCLONEDX_GOMOD_VERSION    := v1.10.0
# promtool runs the alert rules' unit tests (deploy/monitoring).
PROMTOOL_VERSION           := v0.316.0
# Test environment versions; internal/testenv/paths.go holds the same.
export K8S_VERSION     := 1.36.3
export ETCD_VERSION    := 3.6.6
export KWOK_VERSION    := 0.7.0
export RESTATE_VERSION := 1.7.12

BINARIES := krane ctrl krane-sentinel krane-plugin-deployment krane-plugin-sentinel krane-plugin-cilium krane-plugin-configmap
TEST_FLAGS ?= -race -timeout 45m
# Two Go modules: the repository (.) and the sdk plugin authors require
# (sdk/, its own go.mod; the repository builds against it with a replace).
# PKGS are packages of the repository's module, SDK_PKGS of the sdk's; a
# narrowed PKGS runs no sdk tests unless SDK_PKGS names some.
PKGS ?= ./...
SDK_PKGS ?= $(if $(filter ./...,$(PKGS)),./...,)
MODULES := . sdk

.PHONY: build release test test-go deploy-check demo chaos fuzz bench bench-fleet bench-docs bench-smoke proto proto-check lint deps tools testenv clean help screenshots
.PHONY: $(addprefix bin/,$(BINARIES))

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: $(addprefix bin/,$(BINARIES)) ## build every binary into bin/

bin/krane:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/krane
bin/ctrl:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/ctrl
bin/krane-sentinel:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/krane-sentinel
bin/krane-plugin-deployment:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./plugins/deployment
bin/krane-plugin-sentinel:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./plugins/sentinel
bin/krane-plugin-cilium:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./plugins/cilium
bin/krane-plugin-configmap:
	$(GO) -C sdk build -trimpath -ldflags '-s -w' -o $(CURDIR)/$@ ./examples/configmap

# A release: `make release VERSION=vX.Y.Z` (or on a commit tagged vX.Y.Z).
# Everything goes to dist/VERSION: static binaries (CGO_ENABLED=0, so the
# images need no libc), SHA256SUMS, a CycloneDX SBOM of each module, and
# the three images the Dockerfile describes as OCI image layouts, built
# without a Docker daemon (cmd/release). Nothing is pushed: the sdk's tag
# and the images' push are printed.
RELEASE_DIR := dist/$(VERSION)
release: $(STAMPS)/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION) ## version-stamped binaries, SHA256SUMS, SBOMs, the krane, ctrl and krane-sentinel images (OCI layouts) and the built-in plugins' pins (plugins.hcl) into dist/VERSION; prints the sdk tag to push
	@[[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || { echo "VERSION=$(VERSION) is not a release version (vX.Y.Z): tag the commit, or run make release VERSION=vX.Y.Z" >&2; exit 1; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)/bin $(RELEASE_DIR)/sbom
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_DIR)/bin/krane ./cmd/krane
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_DIR)/bin/ctrl ./cmd/ctrl
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_DIR)/bin/krane-sentinel ./cmd/krane-sentinel
	for p in deployment sentinel cilium; do \
	  CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_DIR)/bin/krane-plugin-$$p ./plugins/$$p; done
	CGO_ENABLED=0 $(GO) -C sdk build -trimpath -ldflags '-s -w -X krane.dev/sdk.version=$(VERSION)' -o $(CURDIR)/$(RELEASE_DIR)/bin/krane-plugin-configmap ./examples/configmap
	cyclonedx-gomod mod -json -licenses=false -output $(RELEASE_DIR)/sbom/krane.cdx.json .
	cyclonedx-gomod mod -json -licenses=false -output $(RELEASE_DIR)/sbom/sdk.cdx.json sdk
	$(GO) run ./cmd/release -bin $(RELEASE_DIR)/bin -out $(RELEASE_DIR)/images -version $(VERSION) -pins $(RELEASE_DIR)/plugins.hcl
	cd $(RELEASE_DIR) && sha256sum bin/* sbom/* plugins.hcl > SHA256SUMS
	@echo "==> $(RELEASE_DIR): binaries, SHA256SUMS, sbom/, images/ (OCI layouts), plugins.hcl (the built-in plugins' pins)"
	@echo "==> the sdk's tag (not pushed here): git tag sdk/$(VERSION) $$(git rev-parse HEAD) && git push origin sdk/$(VERSION)"
	@echo "    plugin authors then: go get krane.dev/sdk@$(VERSION)"

demo: deps testenv build ## bring up the whole system locally and show a deploy working (DEMO_EXIT=1: exit after the scenario)
	$(GO) run ./cmd/demo -bin bin $(if $(filter 1,$(DEMO_EXIT)),-exit,)

# A bench run merges its sections into bench/results.json (each with its
# commit, time, machine load and command) and rewrites the figure blocks of
# README.md and docs/ from it; figures are never edited by hand.
bench: deps testenv build ## measure micro-benchmarks, binary sizes, plugin hop, versions/s, watch rows/s, propagation, drift repair, rollout, bootstrap vs raw client-go, resync, memory, writes/s; writes bench/results.json and the docs' tables
	$(GO) run ./cmd/bench -bin bin

# FLEET_FLAGS e.g. -fleet-clusters 100,1000 -fleet-window 60s -fleet-arms streaming,polling,streaming-unshared
FLEET_FLAGS ?=
bench-fleet: deps build ## simulated clusters (100 to 3,000) against one ctrl: streaming vs polling, how costs grow; the write path; writes bench/results.json and the docs' tables
	./scripts/testenv-restate.sh
	$(GO) run ./cmd/bench -bin bin -fleet $(FLEET_FLAGS)

bench-docs: ## rewrite the figure blocks of README.md and docs/ from bench/results.json (measures nothing)
	$(GO) run ./cmd/bench -docs

# Part of make test too (TestSmoke is one of internal/bench's tests).
bench-smoke: deps testenv build ## every measurement of bench and bench-fleet once, at small sizes (about two minutes): proves each runs, asserts no speed
	KRANE_BIN_DIR=$(CURDIR)/bin $(GO) test -count=1 -timeout 15m -run '^TestSmoke$$' ./internal/bench

# Every fuzz target, each for FUZZ_TIME; corpora live in testdata/fuzz.
FUZZ_TIME ?= 30s
FUZZ_TARGETS := ./host/config:FuzzLoad ./ctrl/clusterapi:FuzzReportStatus ./ctrl/console:FuzzLiveEventEncoding \
	./plugins/deployment/controller:FuzzValidateBuild ./plugins/sentinel/controller:FuzzSentinel \
	./plugins/cilium/controller:FuzzPolicy ./sentinel/proxy:FuzzRequestPath
fuzz: deps testenv ## run every fuzz target for FUZZ_TIME (default 30s); 0 failures expected
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "==> $$fn ($$pkg) for $(FUZZ_TIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZ_TIME) $$pkg || exit 1; \
	done

chaos: deps testenv build ## faults while desired state churns, then check nothing was lost (CHAOS_DURATION, default 30m; CHAOS_SEED)
	$(GO) run ./cmd/chaos -bin bin

test: deps testenv proto-check lint build test-go ## everything CI checks: generated code, lint, unit + integration tests

test-go: ## go test of both modules (real apiserver, MySQL and Restate; set PKGS, SDK_PKGS or TEST_FLAGS to narrow)
	@# Both modules run even when the first fails, so one report shows all.
	@rc=0; \
	if [ -n "$(strip $(PKGS))" ]; then echo "==> go test $(PKGS)"; KRANE_BIN_DIR=$(CURDIR)/bin $(GO) test $(TEST_FLAGS) $(PKGS) || rc=1; fi; \
	if [ -n "$(strip $(SDK_PKGS))" ]; then echo "==> go test (sdk) $(SDK_PKGS)"; KRANE_BIN_DIR=$(CURDIR)/bin $(GO) -C sdk test $(TEST_FLAGS) $(SDK_PKGS) || rc=1; fi; \
	exit $$rc

# Part of test-go too (./deploy/check is one of its packages).
deploy-check: deps testenv build ## render every deploy/ overlay, install it into a real API server, prove its RBAC and NetworkPolicies
	KRANE_BIN_DIR=$(CURDIR)/bin $(GO) test $(TEST_FLAGS) ./deploy/check

# The README's pictures of the web console, taken by its browser test from
# the running stack.
SCREENSHOT_DIR := docs/images/console
screenshots: deps testenv build ## run the console's browser test on the whole stack and refresh the README's screenshots (docs/images/console)
	KRANE_BIN_DIR=$(CURDIR)/bin KRANE_SCREENSHOT_DIR=$(CURDIR)/$(SCREENSHOT_DIR) $(GO) test -count=1 -run '^TestConsoleInBrowser$$' -timeout 30m ./e2e

proto: tools ## regenerate Go code from proto/
	buf generate

# Generated Go lives next to the .proto files (proto/) and, for the plugin
# protocol, inside the sdk module (sdk/internal/pluginv1): every *.pb.go
# under proto/ and sdk/ must be exactly what buf generates.
proto-check: tools ## fail when the committed generated code is stale
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	buf generate -o "$$tmp"; \
	gen=$$(cd "$$tmp" && find . -name '*.pb.go' | sort); have=$$(find ./proto ./sdk -name '*.pb.go' | sort); \
	if [ "$$gen" != "$$have" ]; then \
	  diff <(echo "$$gen") <(echo "$$have") || true; \
	  echo "generated files differ from what buf generates: run 'make proto' and commit the result" >&2; exit 1; \
	fi; \
	for f in $$gen; do if ! cmp -s "$$tmp/$$f" "$$f"; then diff -u "$$f" "$$tmp/$$f" | head -40; \
	  echo "generated code in $$f is stale: run 'make proto' and commit the result" >&2; exit 1; fi; done; \
	echo "proto: generated code is current"

lint: tools ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.tools/*')); \
	if [ -n "$$out" ]; then echo "not gofmt-clean:" $$out >&2; exit 1; fi
	@for m in $(MODULES); do echo "==> vet and staticcheck: module $$m"; \
	  (cd $$m && $(GO) vet ./... && staticcheck ./...) || exit 1; done

deps: tools ## Go modules, Go tools, a MariaDB server for private test databases, Chromium for the console's browser test
	$(GO) mod download
	$(GO) -C sdk mod download
	@if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then \
	  echo "==> mariadbd not found: installing mariadb-server from Debian packages"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null; \
	  else echo "cannot install mariadb-server (not root, no sudo): install it, or set KRANE_TEST_MYSQL_DSN to a MySQL server" >&2; exit 1; fi; \
	fi
	@command -v npm >/dev/null || { echo "npm not found: install Node.js and npm (Debian: apt-get install nodejs npm); the Restate server comes from the npm registry" >&2; exit 1; }
	@if [ -z "$${KRANE_CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  echo "==> chromium not found: installing chromium and chromium-driver from Debian packages (the web console's browser test drives it)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "cannot install chromium (not root, no sudo): install the Debian packages chromium and chromium-driver, or set KRANE_CHROMIUM to a Chromium or Chrome binary" >&2; exit 1; fi; \
	fi
	@# The plugin authoring guide's walkthrough (run by e2e) uses kubectl.
	@if ! command -v kubectl >/dev/null; then \
	  echo "==> kubectl not found: installing kubernetes-client from Debian packages"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null; \
	  else echo "cannot install kubectl (not root, no sudo): install it, or put it in PATH" >&2; exit 1; fi; \
	fi

# Each tool is installed at its pinned version; a stamp per version makes a
# version bump reinstall it.
TOOL_STAMPS := $(STAMPS)/buf@$(BUF_VERSION) $(STAMPS)/protoc-gen-go@$(PROTOC_GEN_GO_VERSION) \
	$(STAMPS)/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION) $(STAMPS)/staticcheck@$(STATICCHECK_VERSION) \
	$(STAMPS)/promtool@$(PROMTOOL_VERSION)
tools: $(TOOL_STAMPS) ## install the pinned Go tools into .tools/bin
$(STAMPS)/buf@%:
	GOBIN=$(TOOLS_BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$*
	@mkdir -p $(STAMPS) && touch $@
$(STAMPS)/protoc-gen-go@%:
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$*
	@mkdir -p $(STAMPS) && touch $@
$(STAMPS)/protoc-gen-go-grpc@%:
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$*
	@mkdir -p $(STAMPS) && touch $@
# Installed by `make release` only (not part of `make tools`).
$(STAMPS)/cyclonedx-gomod@%:
	GOBIN=$(TOOLS_BIN) $(GO) install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$*
	@mkdir -p $(STAMPS) && touch $@
# Without Prometheus's service discoveries but Kubernetes's (the one
# scrape-config.yaml uses): a smaller, faster build.
$(STAMPS)/promtool@%:
	GOBIN=$(TOOLS_BIN) $(GO) install -tags remove_all_sd,enable_kubernetes_sd github.com/prometheus/prometheus/cmd/promtool@$*
	@mkdir -p $(STAMPS) && touch $@
$(STAMPS)/staticcheck@%:
	GOBIN=$(TOOLS_BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$*
	@mkdir -p $(STAMPS) && touch $@

testenv: ## build/install the test binaries (kube control plane, kwok, restate-server) into the cache
	$(GO) -C sdk run ./envtest/setup
	./scripts/testenv-restate.sh

clean: ## remove build outputs (the testenv cache stays)
	rm -rf bin
