# Dropline — `make help` lists the targets. `make run` and `make test` are the
# two commands of the README's quick start; CI runs `make lint` and
# `make test` (.ci/run). `make test` installs what the suite needs
# (scripts/tools.sh) before it runs it.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
BIN      := bin/dropline
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...

# golangci-lint is pinned: a newer release brings new checks, and CI must not
# turn red on its own. It is installed from source with `go install` into a
# directory of its own per version (under GOPATH, so it outlives the clone).
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT_DIR     := $(shell $(GO) env GOPATH)/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT         := $(GOLANGCI_LINT_DIR)/golangci-lint

.PHONY: help
help: ## show this help
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z0-9_-]+:.*?## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: services
services: ## make sure Redis and PostgreSQL answer at REDIS_URL / DATABASE_URL (starts them if needed)
	@bash scripts/services.sh

.PHONY: bench-tools
bench-tools: ## install what the black-box benchmarks drive besides the server: wrk, redis-benchmark, pgbench (Debian, as root)
	@bash scripts/bench-tools.sh

.PHONY: tools
tools: ## install what the tests run besides Go and the services: nginx-light, redis-sentinel, chromium (Debian, as root), e2e's npm packages (npm ci)
	@bash scripts/tools.sh

.PHONY: build
build: ## build bin/dropline
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dropline

TOKEN_USER  ?= alice
TOKEN_ADMIN ?=

# Only the token goes to stdout, so `make -s token` can be captured. The
# build is a no-op when bin/dropline is current (after `make run`).
.PHONY: token
token: ## print a dev-mode bearer token for `make run`: make token [TOKEN_USER=ops] [TOKEN_ADMIN=1]
	@$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dropline
	@DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) token --user '$(TOKEN_USER)' $(if $(TOKEN_ADMIN),--admin)

.PHONY: run
run: services build ## start services, migrate, seed the demo and serve in dev mode on http://localhost:8080
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) migrate
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) seed --demo
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) serve

.PHONY: test
# Two passes (scripts/test.sh). First the tests that hold wall-clock bounds
# (the fan-out's 250 ms, the sweeper's second, the fault suite's latency
# checks, the production topology), with nothing else running: two cores
# shared with another package's race-enabled tests can miss them. Then the
# rest of the suite, two packages at a time (go test -p 2), since those
# tests mostly wait.
test: tools services check-generate check-deploy ## install the test tools, then run the whole suite with -race against real services (what CI runs)
	@GO=$(GO) bash scripts/test.sh

.PHONY: test-topology
# Part of `make test` too; this runs it alone, with its FIGURES lines.
test-topology: tools services ## the production topology test alone: nginx, two instances, Redis under Sentinel
	$(GO) test -race -count=1 -timeout 20m -run TestProductionTopology -v ./e2e/faults/

.PHONY: check-deploy
# promtool comes from Debian's prometheus package (make tools installs it).
check-deploy: ## check deploy/alerts.yml with promtool and run its unit tests (deploy/alerts_test.yml)
	promtool check rules deploy/alerts.yml
	promtool test rules deploy/alerts_test.yml

.PHONY: check-generate
check-generate: ## fail if `go generate` changes anything (generated code must be committed)
	@bash scripts/check-generate.sh

.PHONY: generate
generate: ## regenerate code (gqlgen)
	$(GO) generate $(PKGS)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## go vet and golangci-lint (.golangci.yml); installs the pinned golangci-lint first when missing
	$(GO) vet $(PKGS)
	$(GOLANGCI_LINT) run $(PKGS)

# About 2 minutes on 2 cores the first time (it compiles from source); then
# the file exists and this does nothing.
$(GOLANGCI_LINT):
	@echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_DIR)"
	GOBIN=$(GOLANGCI_LINT_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: bench-queue
bench-queue: bench-tools services build ## the admission queue black-box: 50,000 joins, Redis bytes per ticket, longest script, myQueueTicket vs a stock query, 10,000 websocket waiters
	$(GO) run ./cmd/bench-queue --bin $(BIN) $(BENCH_QUEUE_FLAGS)

.PHONY: bench
bench: services ## run the benchmarks (no tests) against real services
	$(GO) test -run '^$$' -bench . -benchmem -timeout 40m $(PKGS)

# Black-box: the built binary as its own process on a free loopback port
# (private redis-server, own database), driven by wrk, next to a bare
# reserve-shaped script (redis-benchmark) and a PostgreSQL-only path
# (pgbench); `make bench-tools` installs wrk, redis-tools and postgresql-client
# when missing (scripts/bench-tools.sh).
# About 2 minutes with the defaults; BENCH_FLAGS="--step 3s --peak 10s" for a quick look.
BENCH_FLAGS ?=
.PHONY: bench-http
bench-http: bench-tools build ## black-box reserve benchmark of bin/dropline vs raw Redis and PostgreSQL; rewrites its section of docs/benchmarks.md
	$(GO) build -trimpath -o bin/bench-floor ./cmd/bench-floor
	$(GO) run ./cmd/bench-http --bin $(BIN) --floor bin/bench-floor --doc docs/benchmarks.md $(BENCH_FLAGS)

# They run against servers, a redis-server and a database of their own
# (scripts/flashsale.sh), removed afterwards: the products a rehearsal makes
# never reach the database `make run` serves.
.PHONY: flashsale
flashsale: ## rehearse a drop (5,000 buyers) against a fresh server of its own: make flashsale [FLASHSALE_ARGS="--buyers 500 --waitlist 100"]
	@bash scripts/flashsale.sh

WATCHERS ?= 10000
.PHONY: watchers
watchers: ## live availability: WATCHERS (10000) subscribers of the hot SKU against a fresh server: make watchers [WATCHERS=n] [FLASHSALE_ARGS="--watch-transport sse"]
	@WATCHERS=$(WATCHERS) REPORT=$${REPORT:-bin/watchers-report.html} bash scripts/flashsale.sh

.PHONY: queue-rehearsal
queue-rehearsal: ## a queued drop, people and bots, against two fresh servers: make queue-rehearsal [FLASHSALE_ARGS="--queue-people 5000"]
	@SERVERS=2 REPORT=$${REPORT:-bin/queue-report.html} FLASHSALE_ARGS="--mode queue --buyers 500 $(FLASHSALE_ARGS)" bash scripts/flashsale.sh

.PHONY: tidy
tidy: ## go mod tidy
	$(GO) mod tidy

.PHONY: playground
playground: ## rebuild the embedded GraphQL playground (server/playground/dist) with npm
	cd web/playground && npm ci && npm run build

.PHONY: shop
shop: ## rebuild the embedded demo shop (server/shop/dist) with npm
	cd web/shop && npm ci && npm run build

.PHONY: docker
docker: ## build the dropline container image
	docker build -t dropline:$(VERSION) .

.PHONY: clean
clean: ## remove build output (not .services/, which holds local service data)
	rm -rf bin coverage.out
