#!/usr/bin/env bash
# scripts/flashsale.sh — `make flashsale`, `make watchers` and `make
# queue-rehearsal`: a drop rehearsal against servers of its own, in one
# command. It makes sure
# PostgreSQL answers (make services), builds bin/dropline and bin/flashsale,
# and gives the run its own state: a private redis-server on a free loopback
# port and a new database beside DATABASE_URL's (its name with
# `_flashsale` appended), made empty at the start. SERVERS (default 1)
# `dropline serve` processes run in dev mode on free loopback ports (never
# :8080), sharing that redis-server and database, then
#
#   flashsale --dev --url <each server> [--watchers $WATCHERS --floor-url <bench-floor ws>] --report $REPORT $FLASHSALE_ARGS
#
# and the servers, the redis-server and the database are removed however the
# run ends. So the products a rehearsal creates never reach the database
# `make run` serves: the demo shop keeps its seeded catalogue. The script
# checks that too: it counts DATABASE_URL's products before and after, and
# fails when the number moved. The exit status is otherwise flashsale's: 0
# when the verdict passed.
#
# Environment: SERVERS (default 1; `make queue-rehearsal` sets 2), WATCHERS
# (default 0: a drop without watchers; `make watchers` sets 10000), REPORT (default bin/flashsale-report.html), FLASHSALE_ARGS
# (more flags, e.g. "--buyers 500" or "--watch-transport sse"),
# DATABASE_URL as for `make run`. The servers' logs go to
# bin/flashsale-server.log (the first) and bin/flashsale-server-<n>.log.
#
# Open files: every watcher is one connection in the driver and one in the
# server. Go raises each process's soft RLIMIT_NOFILE to the hard limit by
# itself; this script checks that the hard limit leaves room and says how to
# raise it when it does not.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WATCHERS="${WATCHERS:-0}"
SERVERS="${SERVERS:-1}"
REPORT="${REPORT:-bin/flashsale-report.html}"
GO="${GO:-go}"
served_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable}"

die() { printf 'flashsale: %s\n' "$*" >&2; exit 2; }
[[ "$SERVERS" =~ ^[1-8]$ ]] || die "SERVERS must be 1-8"

if ((WATCHERS > 0)); then
	need=$((WATCHERS + 1024))
	hard="$(ulimit -Hn)"
	if [[ "$hard" != unlimited ]] && ((hard < need)); then
		die "$WATCHERS watchers need $need open files per process, the hard limit is $hard: raise it (ulimit -Hn $need as root, or LimitNOFILE) or set WATCHERS lower"
	fi
	ulimit -n "$hard"
fi

# The run's database: DATABASE_URL's server, its database name + _flashsale.
base="${served_url%%\?*}"
query=""
if [[ "$served_url" == *\?* ]]; then
	query="?${served_url#*\?}"
fi
[[ "$base" =~ ^postgres(ql)?://[^/]+/[^/]+$ ]] || die "DATABASE_URL must name a database (postgres://user@host:port/db)"
served_db="${base##*/}"
own_db="${served_db}_flashsale"
server_url="${base%/*}"
admin_url="$server_url/postgres$query"
own_url="$server_url/$own_db$query"

bash scripts/services.sh
psql -qX "$admin_url" -c "DROP DATABASE IF EXISTS \"$own_db\" WITH (FORCE)" -c "CREATE DATABASE \"$own_db\""
# DATABASE_URL's products; 0 when that database is missing or not migrated.
products() { psql -qXtA "$served_url" -c 'SELECT count(*) FROM products' 2>/dev/null || echo 0; }
before="$(products)"

mkdir -p bin
"$GO" build -trimpath -o bin/dropline ./cmd/dropline
"$GO" build -trimpath -o bin/flashsale ./cmd/flashsale
if ((WATCHERS > 0)); then
	"$GO" build -trimpath -o bin/bench-floor ./cmd/bench-floor
fi

free_port() {
	local p
	for p in $(seq "$1" "$2"); do
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	die "no free port in $1-$2"
}

redis_dir="$(mktemp -d "${TMPDIR:-/tmp}/dropline-flashsale-XXXXXX")"
redis_port="$(free_port 18380 18479)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
	--maxmemory-policy noeviction --dir "$redis_dir" --logfile "$redis_dir/redis.log" &
redis_pid=$!
pids=()
floor_pid=""
cleanup() {
	if [[ -n "$floor_pid" ]]; then
		kill "$floor_pid" 2>/dev/null || true
		wait "$floor_pid" 2>/dev/null || true
	fi
	local p
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	kill "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	rm -rf "$redis_dir"
	psql -qX "$admin_url" -c "DROP DATABASE IF EXISTS \"$own_db\" WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do
	[[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" == PONG ]] && break
	sleep 0.1
done

export DROPLINE_DEV=1 DATABASE_URL="$own_url" REDIS_URL="redis://127.0.0.1:$redis_port/0"
bin/dropline migrate
args=(--dev --report "$REPORT")
next_port=18480
for n in $(seq 1 "$SERVERS"); do
	port="$(free_port "$next_port" 18580)"
	next_port=$((port + 1))
	log=bin/flashsale-server.log
	((n == 1)) || log="bin/flashsale-server-$n.log"
	DROPLINE_ADDR="127.0.0.1:$port" DROPLINE_LOG_LEVEL="${DROPLINE_LOG_LEVEL:-warn}" \
		bin/dropline serve >"$log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			break
		fi
		kill -0 "$pid" 2>/dev/null || die "the server exited; see $log"
		sleep 0.1
	done
	printf 'flashsale: server pid %s on 127.0.0.1:%s, redis-server on :%s, database %s; load average %s\n' \
		"$pid" "$port" "$redis_port" "$own_db" "$(cut -d' ' -f1-3 /proc/loadavg)"
	args+=(--url "http://127.0.0.1:$port")
done
if ((WATCHERS > 0)); then
	args+=(--watchers "$WATCHERS")
	# The fan-out floor (bench/floor): a bare broadcaster the watchers'
	# CPU per delivery is divided by.
	floor_port="$(free_port 18581 18680)"
	bin/bench-floor ws "127.0.0.1:$floor_port" &
	floor_pid=$!
	for _ in $(seq 1 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$floor_port") 2>/dev/null && break
		sleep 0.1
	done
	args+=(--floor-url "http://127.0.0.1:$floor_port")
fi
status=0
# shellcheck disable=SC2086 # FLASHSALE_ARGS is a list of flags
bin/flashsale "${args[@]}" ${FLASHSALE_ARGS:-} || status=$?

after="$(products)"
if [[ "$after" != "$before" ]]; then
	echo "flashsale: the database make run serves ($served_db) had $before products before the run and has $after now" >&2
	exit 1
fi
echo "flashsale: $served_db untouched ($before products before and after); $own_db removed"
exit "$status"
