#!/usr/bin/env bash
# scripts/tools.sh — `make tools`, the first step of `make test`: install what
# the test suite runs besides Go, Redis and PostgreSQL (which `make services`
# sees to), so that `make test` passes on a fresh Debian machine with Go and
# make:
#
#   nginx-light      /usr/sbin/nginx: e2e/faults' TestProductionTopology puts
#                    it in front of two instances (deploy/nginx.conf)
#   redis-sentinel   the same test's three sentinels
#   prometheus       for /usr/bin/promtool: `make check-deploy` checks the
#                    alert rules of deploy/alerts.yml and runs their unit
#                    tests (the package's server is not started here)
#   chromium         /usr/bin/chromium: e2e's TestShopInABrowser drives the
#                    demo shop in it with Playwright (playwright-core; its own
#                    browser downloads are not used). $CHROMIUM overrides it.
#   node 20+, npm    e2e's Node client tests and the browser test; Debian 12's
#                    nodejs is 18, so a missing or older node is reported,
#                    not installed
#   e2e/node, e2e/browser, e2e/gateway
#                    their npm packages (e2e/gateway: Apollo's gateway and
#                    server for the federation test), with `npm ci` from the committed
#                    package-lock.json, when node_modules does not already
#                    hold exactly that lockfile (the stamp the e2e tests
#                    write and check too: they install the same way when run
#                    on their own)
#
# Debian packages are installed when missing and we are root; otherwise the
# exact command is printed and the script fails. Idempotent: on a machine
# that has everything it prints one line and changes nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '%s\n' "$*"; }
die() { printf 'tools: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/apt.sh
. "$ROOT/scripts/apt.sh"

ensure_packages() {
	local pkgs=()
	command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || pkgs+=(nginx-light)
	command -v redis-sentinel >/dev/null 2>&1 || pkgs+=(redis-sentinel)
	command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
	[[ -n "${CHROMIUM:-}" || -x /usr/bin/chromium ]] || pkgs+=(chromium)
	if ((${#pkgs[@]} > 0)); then
		apt_install "${pkgs[@]}"
	fi
}

ensure_node() {
	local major
	command -v node >/dev/null 2>&1 || die "node 20 or later is missing (e2e's Node client and browser tests need it): install Node.js 20+ with npm (Debian 12's nodejs is 18, too old)"
	command -v npm >/dev/null 2>&1 || die "npm is missing (e2e installs its Node packages with it): install npm for node $(node --version)"
	major="$(node -p "process.versions.node.split('.')[0]")"
	((major >= 20)) || die "node $(node --version) is too old: e2e's Node tests need Node.js 20 or later"
}

# npm_ci DIR installs DIR's locked npm packages unless node_modules holds
# exactly that lockfile already.
npm_ci() {
	local dir="$ROOT/$1" want stamp
	want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
	stamp="$dir/node_modules/.dropline-lock-sha256"
	if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
		return
	fi
	(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
	printf '%s' "$want" >"$stamp"
	say "npm: installed $1's packages from its package-lock.json"
}

ensure_packages
ensure_node
npm_ci e2e/node
npm_ci e2e/browser
npm_ci e2e/gateway
say "tools: nginx, redis-sentinel, promtool, chromium, node $(node --version) and e2e's npm packages are in place"
