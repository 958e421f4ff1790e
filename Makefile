# Dropline — `make help` lists the targets. `make run` and `make test` are the
# two commands of the README's quick start; CI runs `make test` (.ci/run).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
BIN      := bin/dropline
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...

.PHONY: help
help: ## show this help
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z0-9_-]+:.*?## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: services
services: ## make sure Redis and PostgreSQL answer at REDIS_URL / DATABASE_URL (starts them if needed)
	@bash scripts/services.sh

.PHONY: build
build: ## build bin/dropline
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dropline

.PHONY: run
run: services build ## start services, migrate, seed the demo and serve in dev mode on http://localhost:8080
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) migrate
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) seed --demo
	DROPLINE_DEV=$${DROPLINE_DEV:-1} $(BIN) serve

.PHONY: test
test: services check-generate ## run the whole suite with -race against real services (what CI runs)
	$(GO) test -race -count=1 -timeout 40m $(PKGS)

.PHONY: check-generate
check-generate: ## fail if `go generate` changes anything (generated code must be committed)
	@bash scripts/check-generate.sh

.PHONY: generate
generate: ## regenerate code (gqlgen)
	$(GO) generate $(PKGS)

.PHONY: lint
lint: ## go vet, plus golangci-lint when installed
	$(GO) vet $(PKGS)
	@if command -v golangci-lint >/dev/null 2>&1; then \
		golangci-lint run $(PKGS); \
	else \
		echo "golangci-lint not installed, skipped: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@latest"; \
	fi

.PHONY: bench
bench: services ## run the benchmarks (no tests) against real services
	$(GO) test -run '^$$' -bench . -benchmem -timeout 40m $(PKGS)

.PHONY: tidy
tidy: ## go mod tidy
	$(GO) mod tidy

.PHONY: playground
playground: ## rebuild the embedded GraphQL playground (server/playground/dist) with npm
	cd web/playground && npm ci && npm run build

.PHONY: docker
docker: ## build the dropline container image
	docker build -t dropline:$(VERSION) .

.PHONY: clean
clean: ## remove build output (not .services/, which holds local service data)
	rm -rf bin coverage.out
