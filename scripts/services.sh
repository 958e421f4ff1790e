#!/usr/bin/env bash
# scripts/services.sh — `make services`: make sure Redis 7 and PostgreSQL 15+
# answer where REDIS_URL and DATABASE_URL point (defaults:
# redis://127.0.0.1:6379/0 and
# postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable).
#
# For each service, in order:
#   1. reuse a server that already answers;
#   2. else, when `docker compose` works and a Docker engine answers,
#      `docker compose up -d` the service from docker-compose.yml;
#   3. else start it natively: install the Debian package when missing and
#      we are root (or print the exact install command and exit 1), then
#      start Redis in .services/ and PostgreSQL as the system cluster (root)
#      or in .services/postgres (non-root).
# Then create the database DATABASE_URL names when it is missing.
#
# It also makes sure redis-cli and redis-server exist: the tests start
# throwaway Redis servers and clusters (redis-cli --cluster create).
#
# Idempotent; prints one line per thing it did. DROPLINE_SERVICES=native or
# DROPLINE_SERVICES=docker forces a path (default: auto).
#
# Native PostgreSQL started here trusts connections from 127.0.0.1 and ::1
# when DATABASE_URL has no password (a developer/CI machine, not a server),
# or gets the URL's password set on its role.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE_DIR="$ROOT/.services"
WAIT_SECONDS="${SERVICES_WAIT_SECONDS:-60}"
MODE="${DROPLINE_SERVICES:-auto}"

REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable}"

say() { printf '%s\n' "$*"; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/apt.sh
. "$ROOT/scripts/apt.sh"

# parse_url URL sets U_USER U_PASS U_HOST U_PORT U_PATH (no percent-decoding).
parse_url() {
	local url="$1" rest hostport userinfo=""
	rest="${url#*://}"
	rest="${rest%%\?*}"
	hostport="${rest%%/*}"
	U_PATH=""
	if [[ "$rest" == */* ]]; then
		U_PATH="${rest#*/}"
	fi
	if [[ "$hostport" == *@* ]]; then
		userinfo="${hostport%@*}"
		hostport="${hostport##*@}"
	fi
	U_USER="${userinfo%%:*}"
	U_PASS=""
	if [[ "$userinfo" == *:* ]]; then
		U_PASS="${userinfo#*:}"
	fi
	U_PORT=""
	if [[ "$hostport" == \[* ]]; then
		U_HOST="${hostport%%]*}"
		U_HOST="${U_HOST#[}"
		if [[ "$hostport" == *]:* ]]; then
			U_PORT="${hostport##*]:}"
		fi
	else
		U_HOST="${hostport%%:*}"
		if [[ "$hostport" == *:* ]]; then
			U_PORT="${hostport##*:}"
		fi
	fi
}

is_local() {
	case "$1" in
	"" | 127.0.0.1 | localhost | ::1) return 0 ;;
	esac
	return 1
}

# wait_for NAME CMD... retries CMD once a second for WAIT_SECONDS.
wait_for() {
	local name="$1" i
	shift
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 1
	done
	die "$name did not answer within ${WAIT_SECONDS}s"
}

docker_usable() {
	[[ "$MODE" != native ]] &&
		command -v docker >/dev/null 2>&1 &&
		docker compose version >/dev/null 2>&1 &&
		docker info >/dev/null 2>&1
}

compose_up() {
	local svc="$1"
	(cd "$ROOT" && docker compose up -d --wait "$svc" >/dev/null)
}

# --- tools the tests need ----------------------------------------------------

ensure_tools() {
	local pkgs=()
	command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
	command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
	if ! command -v psql >/dev/null 2>&1 || ! command -v pg_isready >/dev/null 2>&1; then
		pkgs+=(postgresql-client)
	fi
	if ((${#pkgs[@]} > 0)); then
		apt_install "${pkgs[@]}"
	fi
}

# --- Redis -------------------------------------------------------------------

redis_ping() {
	local args=(-h "$R_HOST" -p "$R_PORT")
	if [[ -n "$R_PASS" ]]; then
		args+=(-a "$R_PASS" --no-auth-warning)
	fi
	[[ "$(redis-cli "${args[@]}" ping 2>/dev/null)" == PONG ]]
}

start_redis_native() {
	is_local "$R_HOST" || die "Redis at $R_HOST:$R_PORT does not answer and is not on this machine: start it there or fix REDIS_URL"
	local dir="$STATE_DIR/redis"
	mkdir -p "$dir"
	local args=(--daemonize yes --bind 127.0.0.1 -::1 --port "$R_PORT"
		--save "" --appendonly no --dir "$dir"
		--logfile "$STATE_DIR/redis.log" --pidfile "$STATE_DIR/redis.pid")
	if [[ -n "$R_PASS" ]]; then
		args+=(--requirepass "$R_PASS")
	fi
	redis-server "${args[@]}" >/dev/null
	wait_for "Redis at $R_HOST:$R_PORT" redis_ping
	say "redis: started natively on $R_HOST:$R_PORT (log: .services/redis.log)"
}

ensure_redis() {
	case "$REDIS_URL" in
	redis-cluster://* | rediss-cluster://*)
		say "redis: REDIS_URL is a cluster; make services manages a single server only, leaving it alone"
		return
		;;
	rediss://*)
		say "redis: REDIS_URL uses TLS; make services manages a plain local server only, leaving it alone"
		return
		;;
	esac
	parse_url "$REDIS_URL"
	R_HOST="${U_HOST:-127.0.0.1}"
	R_PORT="${U_PORT:-6379}"
	R_PASS="$U_PASS"

	if redis_ping; then
		say "redis: reusing the server answering at $R_HOST:$R_PORT"
		return
	fi
	if [[ "$MODE" != native ]] && is_local "$R_HOST" && docker_usable; then
		REDIS_PORT="$R_PORT" compose_up redis
		wait_for "Redis at $R_HOST:$R_PORT" redis_ping
		say "redis: started with docker compose on $R_HOST:$R_PORT"
		return
	fi
	[[ "$MODE" == docker ]] && die "DROPLINE_SERVICES=docker but docker compose or the Docker engine is not available"
	start_redis_native
}

# --- PostgreSQL --------------------------------------------------------------

pg_answers() { pg_isready -q -h "$P_HOST" -p "$P_PORT"; }

# pg_version prints the newest PostgreSQL major version installed.
pg_version() {
	local v
	v="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)"
	if [[ -n "$v" && -x "/usr/lib/postgresql/$v/bin/postgres" ]]; then
		printf '%s\n' "$v"
	fi
}

pg_admin_url() {
	local auth="$P_USER"
	if [[ -n "$P_PASS" ]]; then
		auth="$P_USER:$P_PASS"
	fi
	printf 'postgres://%s@%s:%s/postgres?sslmode=disable' "$auth" "$P_HOST_URL" "$P_PORT"
}

# trust_loopback lets the URL's user in without a password over 127.0.0.1
# and ::1 (Debian's default is scram for TCP), and reloads.
trust_loopback() {
	local ver="$1" hba="/etc/postgresql/$1/main/pg_hba.conf" tmp
	[[ -f "$hba" ]] || return 0
	grep -q '^# dropline: make services' "$hba" && return 0
	tmp="$(mktemp)"
	{
		printf '%s\n' '# dropline: make services — trust loopback TCP for local development'
		printf '%s\n' 'host all all 127.0.0.1/32 trust' 'host all all ::1/128 trust'
		cat "$hba"
	} >"$tmp"
	cat "$tmp" >"$hba"
	rm -f "$tmp"
	pg_ctlcluster --skip-systemctl-redirect "$ver" main reload >/dev/null 2>&1 || true
	say "postgres: trusting 127.0.0.1 and ::1 in $hba (DATABASE_URL has no password)"
}

# set_role_password makes the URL's role exist with the URL's password.
set_role_password() {
	local sql
	sql="DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '${P_USER//\'/\'\'}') THEN
    CREATE ROLE \"${P_USER//\"/\"\"}\" LOGIN SUPERUSER;
  END IF;
END \$\$;
ALTER ROLE \"${P_USER//\"/\"\"}\" PASSWORD '${P_PASS//\'/\'\'}';"
	runuser -u postgres -- psql -q -p "$P_PORT" -d postgres -c "$sql" >/dev/null
	say "postgres: role $P_USER has the password from DATABASE_URL"
}

start_postgres_system_cluster() {
	local ver
	ver="$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)"
	if [[ -z "$ver" || ! -d "/etc/postgresql/$ver/main" ]]; then
		ver="$(pg_version)"
		pg_createcluster --port "$P_PORT" "$ver" main >/dev/null
		say "postgres: created the system cluster $ver/main on port $P_PORT"
	fi
	local conf_port
	conf_port="$(sed -n 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' "/etc/postgresql/$ver/main/postgresql.conf" | tail -n 1)"
	if [[ -n "$conf_port" && "$conf_port" != "$P_PORT" ]]; then
		die "the system cluster $ver/main listens on port $conf_port, but DATABASE_URL says $P_PORT: change one of them"
	fi
	# The package's postinst may already have started it: start is then a no-op.
	pg_ctlcluster --skip-systemctl-redirect "$ver" main start >/dev/null 2>&1 || pg_answers ||
		die "could not start the system cluster $ver/main: see /var/log/postgresql/postgresql-$ver-main.log"
	wait_for "PostgreSQL at $P_HOST:$P_PORT" pg_answers
	configure_system_auth "$ver"
	say "postgres: the system cluster $ver/main is running on $P_HOST:$P_PORT"
}

# configure_system_auth makes the system cluster accept DATABASE_URL's
# credentials over TCP.
configure_system_auth() {
	if [[ -n "$P_PASS" ]]; then
		set_role_password
	else
		trust_loopback "$1"
	fi
}

# system_cluster_version prints the version of a local system cluster we may
# configure (root only), or nothing.
system_cluster_version() {
	is_root && is_local "$P_HOST" || return 0
	local ver
	ver="$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)"
	if [[ -n "$ver" && -f "/etc/postgresql/$ver/main/pg_hba.conf" ]]; then
		printf '%s\n' "$ver"
	fi
}

start_postgres_local_dir() {
	local ver bin dir="$STATE_DIR/postgres"
	ver="$(pg_version)"
	bin="/usr/lib/postgresql/$ver/bin"
	mkdir -p "$STATE_DIR"
	if [[ ! -f "$dir/PG_VERSION" ]]; then
		local pwfile=()
		if [[ -n "$P_PASS" ]]; then
			printf '%s\n' "$P_PASS" >"$STATE_DIR/pwfile"
			pwfile=(--pwfile="$STATE_DIR/pwfile" --auth-host=scram-sha-256)
		else
			pwfile=(--auth-host=trust)
		fi
		"$bin/initdb" -D "$dir" -U "$P_USER" -E UTF8 --auth-local=trust "${pwfile[@]}" >"$STATE_DIR/initdb.log"
		rm -f "$STATE_DIR/pwfile"
		say "postgres: initialised a data directory in .services/postgres"
	fi
	"$bin/pg_ctl" -D "$dir" -l "$STATE_DIR/postgres.log" -w -t "$WAIT_SECONDS" \
		-o "-p $P_PORT -c listen_addresses=localhost -k $STATE_DIR" start >/dev/null
	wait_for "PostgreSQL at $P_HOST:$P_PORT" pg_answers
	say "postgres: started natively from .services/postgres on $P_HOST:$P_PORT (log: .services/postgres.log)"
}

start_postgres_native() {
	is_local "$P_HOST" || die "PostgreSQL at $P_HOST:$P_PORT does not answer and is not on this machine: start it there or fix DATABASE_URL"
	if [[ -z "$(pg_version)" ]]; then
		apt_install postgresql
	fi
	if is_root; then
		start_postgres_system_cluster
	else
		start_postgres_local_dir
	fi
}

ensure_database() {
	local db="$P_DB" admin exists
	admin="$(pg_admin_url)"
	local query="SELECT 1 FROM pg_database WHERE datname = '${db//\'/\'\'}'" ver
	if ! exists="$(psql "$admin" -tAc "$query" 2>&1)"; then
		# A reused Debian cluster (say, started by its package) still has the
		# default scram rule for TCP: configure it once, then retry.
		ver="$(system_cluster_version)"
		[[ -n "$ver" ]] || die "cannot log in to PostgreSQL at $P_HOST:$P_PORT as $P_USER: ${exists//$'\n'/ }"
		configure_system_auth "$ver"
		exists="$(psql "$admin" -tAc "$query" 2>&1)" ||
			die "cannot log in to PostgreSQL at $P_HOST:$P_PORT as $P_USER: ${exists//$'\n'/ }"
	fi
	if [[ "$exists" == 1 ]]; then
		say "postgres: database $db exists"
		return
	fi
	psql "$admin" -qc "CREATE DATABASE \"${db//\"/\"\"}\"" >/dev/null
	say "postgres: created database $db"
}

ensure_postgres() {
	case "$DATABASE_URL" in
	postgres://* | postgresql://*) ;;
	*) die "make services understands DATABASE_URL only in URL form (postgres://user@host:port/db)" ;;
	esac
	parse_url "$DATABASE_URL"
	P_HOST="${U_HOST:-127.0.0.1}"
	P_HOST_URL="$P_HOST"
	if [[ "$P_HOST" == *:* ]]; then
		P_HOST_URL="[$P_HOST]"
	fi
	P_PORT="${U_PORT:-5432}"
	P_USER="${U_USER:-postgres}"
	P_PASS="$U_PASS"
	P_DB="${U_PATH:-$P_USER}"

	if pg_answers; then
		say "postgres: reusing the server answering at $P_HOST:$P_PORT"
	elif [[ "$MODE" != native ]] && is_local "$P_HOST" && docker_usable; then
		POSTGRES_PORT="$P_PORT" compose_up postgres
		wait_for "PostgreSQL at $P_HOST:$P_PORT" pg_answers
		say "postgres: started with docker compose on $P_HOST:$P_PORT"
	else
		[[ "$MODE" == docker ]] && die "DROPLINE_SERVICES=docker but docker compose or the Docker engine is not available"
		start_postgres_native
	fi
	ensure_database
}

ensure_tools
ensure_redis
ensure_postgres
