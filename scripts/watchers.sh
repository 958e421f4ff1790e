#!/usr/bin/env bash
# scripts/watchers.sh — `make watchers`: the live-availability measurement in
# one command. It makes sure Redis and PostgreSQL answer (make services),
# builds bin/dropline and bin/flashsale, starts `dropline serve` in dev mode
# on a free loopback port (never :8080), runs
#
#   flashsale --dev --watchers $WATCHERS --url <that server> --report $REPORT $FLASHSALE_ARGS
#
# and stops the server it started (by its PID) however the run ends. The
# exit status is flashsale's: 0 when the verdict passed.
#
# Environment: WATCHERS (default 10000), REPORT (default
# bin/watchers-report.html), FLASHSALE_ARGS (more flags, e.g.
# "--watch-transport sse" or "--watch-skus 1000"), REDIS_URL and
# DATABASE_URL as for `make run`. The server's log goes to
# bin/watchers-server.log.
#
# Open files: every watcher is one connection in the driver and one in the
# server. Go raises each process's soft RLIMIT_NOFILE to the hard limit by
# itself; this script checks that the hard limit leaves room and says how to
# raise it when it does not.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WATCHERS="${WATCHERS:-10000}"
REPORT="${REPORT:-bin/watchers-report.html}"
GO="${GO:-go}"

die() { printf 'watchers: %s\n' "$*" >&2; exit 2; }

need=$((WATCHERS + 1024))
hard="$(ulimit -Hn)"
if [[ "$hard" != unlimited ]] && (( hard < need )); then
	die "$WATCHERS watchers need $need open files per process, the hard limit is $hard: raise it (ulimit -Hn $need as root, or LimitNOFILE) or set WATCHERS lower"
fi
ulimit -n "$hard"

bash scripts/services.sh
mkdir -p bin
"$GO" build -trimpath -o bin/dropline ./cmd/dropline
"$GO" build -trimpath -o bin/flashsale ./cmd/flashsale

port=""
for p in $(seq 18480 18580); do
	if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		port="$p"
		break
	fi
done
[[ -n "$port" ]] || die "no free port in 18480-18580"

export DROPLINE_DEV=1
bin/dropline migrate
DROPLINE_ADDR="127.0.0.1:$port" DROPLINE_LOG_LEVEL="${DROPLINE_LOG_LEVEL:-warn}" \
	bin/dropline serve >bin/watchers-server.log 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		break
	fi
	kill -0 "$pid" 2>/dev/null || die "the server exited; see bin/watchers-server.log"
	sleep 0.1
done

printf 'watchers: server pid %s on 127.0.0.1:%s; load average %s\n' "$pid" "$port" "$(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086 # FLASHSALE_ARGS is a list of flags
bin/flashsale --dev --url "http://127.0.0.1:$port" --watchers "$WATCHERS" --report "$REPORT" ${FLASHSALE_ARGS:-}
