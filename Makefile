# idemlab — everyday commands. `make help` lists them.

SHELL := /bin/bash

# The tests create their databases on this server (see internal/testdb).
DATABASE_URL ?= postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL

# The same build as the Dockerfile (deploy_test.go keeps that one honest).
GO_BUILD = CGO_ENABLED=0 go build -trimpath -ldflags="-s -w"

.PHONY: help run devdb-stop build test test-short generate lint bench fuzz chaos

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

run: ## run the demo locally (DEMO_MODE=true, in-process fakes); no PostgreSQL at DATABASE_URL: a private one in tmp/pg; no NATS at NATS_URL: an embedded one, data in tmp/nats
	DATABASE_URL="$$(scripts/devdb.sh)" DEMO_MODE=true NATS_DATA_DIR="$${NATS_DATA_DIR:-tmp/nats}" go run ./cmd/web serve

devdb-stop: ## stop the private PostgreSQL `make run` started in tmp/pg (its data stays)
	scripts/devdb.sh stop

build: ## build bin/web exactly as the Dockerfile does
	$(GO_BUILD) -o bin/web ./cmd/web

# The two tiers (docs/testing.md). Both start with scripts/test-deps.sh
# (PostgreSQL started, redis-server and Chromium installed when missing; NATS
# and Kafka are embedded in the tests). TEST_P packages run at once: with
# their pools, the suite holds at most 60 PostgreSQL connections (measured:
# scripts/connpeak.sh). A package out of time says in one line which tests
# were running (scripts/timeouts.awk); the timeouts fit a loaded machine.
TEST_P ?= 2
test: ## the full tier, as CI runs it: every test with the race detector, browsers and the chaos soak included
	scripts/test-deps.sh
	set -o pipefail; go test -race -count=1 -p $(TEST_P) -timeout 30m ./... 2>&1 | awk -f scripts/timeouts.awk

test-short: ## the tier to run while working: go test -short (no browser, chaos soak, child processes or database restarts)
	scripts/test-deps.sh short
	set -o pipefail; go test -short -count=1 -p $(TEST_P) -timeout 5m ./... 2>&1 | awk -f scripts/timeouts.awk

generate: ## regenerate templ components (*_templ.go) and migrations/schema.sql, both committed
	go tool templ generate
	scripts/schema.sh

lint: ## gofmt, go vet, go mod tidy, staticcheck, no unreachable code (deadcode), generated templ files and schema.sql up to date, govulncheck (VULNDB=… for a copy of its database)
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files need formatting:"; echo "$$unformatted"; exit 1; \
	fi
	go vet ./...
	@go mod tidy -diff || { echo "lint: go.mod/go.sum are not tidy: run 'go mod tidy'"; exit 1; }
	go tool staticcheck ./...
	@dead="$$(go tool deadcode -test ./...)"; \
	if [ -n "$$dead" ]; then \
		echo "lint: unreachable code (delete it, or call it from a test if it is a test hook):"; echo "$$dead"; exit 1; \
	fi
	go tool templ generate
	@git diff --exit-code -- '*_templ.go' || \
		{ echo "lint: *_templ.go out of date: run 'make generate' and commit the result"; exit 1; }
	@untracked="$$(git ls-files --others --exclude-standard -- '*_templ.go')"; \
	if [ -n "$$untracked" ]; then \
		echo "lint: generated but not committed:"; echo "$$untracked"; exit 1; \
	fi
	scripts/schema.sh check
	scripts/vulncheck.sh

bench: ## pgbench floor vs the app over HTTP, replay, booking contention, recovery (docs/performance.md)
	scripts/ensure-postgres.sh
	scripts/bench/bench.sh

# CHAOS_FLAGS, e.g. make chaos CHAOS_FLAGS="-duration 10m -seed 7" (go run ./cmd/chaos -h lists them).
CHAOS_FLAGS ?=
chaos: ## kill, pause, delay and restart the running system, then check every promise (docs/reliability.md)
	go run ./cmd/chaos $(CHAOS_FLAGS)

# Every fuzz target; `make test` runs their seeds, this explores for FUZZTIME each.
FUZZTIME ?= 10s
fuzz: ## run each fuzz test for FUZZTIME (default 10s): parsers of untrusted input
	@for pkg in ./internal/web ./internal/users ./cmd/web; do \
		for target in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$target"; \
			go test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done
