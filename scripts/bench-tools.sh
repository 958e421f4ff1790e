#!/usr/bin/env bash
# scripts/bench-tools.sh — the first step of `make bench-http` and
# `make bench-queue`: install the load generators and baselines the
# black-box benchmarks drive, when missing:
#
#   wrk                 the HTTP load (reserves, joins, polls, the storm)
#   redis-tools         redis-benchmark: the bare reserve-shaped script
#   postgresql-client   pgbench: the PostgreSQL-only reservation path
#
# Debian packages are installed when missing and we are root; otherwise the
# exact command is printed and the script fails. Idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '%s\n' "$*"; }
die() { printf 'bench-tools: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/apt.sh
. "$ROOT/scripts/apt.sh"

pkgs=()
command -v wrk >/dev/null 2>&1 || pkgs+=(wrk)
command -v redis-benchmark >/dev/null 2>&1 || pkgs+=(redis-tools)
command -v pgbench >/dev/null 2>&1 || pkgs+=(postgresql-client)
if ((${#pkgs[@]} > 0)); then
	apt_install "${pkgs[@]}"
fi
