#!/usr/bin/env bash
# scripts/test.sh — the test run of `make test` (what CI runs): the whole
# suite with -race, in two passes.
#
# 1. The quiet pass: the tests that hold a wall-clock bound (a delivery
#    within 250 ms, a release within a second of its expiry, a takeover
#    soon after a lease ends, ...) run with nothing else beside them, one
#    package at a time. One `go test -c` builds their binaries first.
# 2. The rest of the suite, two packages at a time (go test -p 2). None of
#    these tests holds a bound another package's load could break, and most
#    of their time is spent waiting on Redis, PostgreSQL, a server or a
#    timer, so a second package uses the core the first leaves idle.
#
# QUIET names the tests of pass 1, by package; pass 2 skips exactly these
# names. A test that gets a wall-clock bound goes into QUIET. Both passes
# always run, and either failing fails the run.
#
#   bash scripts/test.sh          both passes (make test)
#   bash scripts/test.sh quiet    the quiet pass alone
#   bash scripts/test.sh rest     the rest alone
set -uo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
only="${1:-}"
case "$only" in
"" | quiet | rest) ;;
*)
	echo "usage: scripts/test.sh [quiet|rest]" >&2
	exit 2
	;;
esac

# The packages with tests in the quiet pass, and those tests.
dirs=(e2e/faults worker live inventory server/graphql e2e)
declare -A QUIET=(
	[e2e/faults]="TestProductionTopology TestWSSubscriptionFlood TestWSSlowloris TestWSTrickleAfterInit
		TestInstanceKilledExpiryWithinASecond TestPoisonOutboxEntryMidDrop TestCartKilledMidway
		TestRebuildOfASKUWith200kReservations"
	[worker]="TestHoldSweeperReleasesFiveThousandHoldsOnceUnderASecond TestHoldsExpireOnTimeAfterTheirSweeperDied
		TestLeaseTakeoverOnlyAfterExpiryAndFencing TestProductChangesMissedByRedisConverge"
	[live]="TestHotSKUFanout TestStalledSubscriberIsDropped"
	[inventory]="TestCartWhoseCallerStalledIsLetGo TestExtensionRacingExpiry"
	[server/graphql]="TestStalledReaderIsDropped TestStalledSSEReaderIsDropped"
	[e2e]="TestLiveStockOverWebsocket TestLiveGraphQLWSReferenceClient"
)

# The packages the rest of the suite starts with: the longest, so that the
# last minutes are not one long package running alone.
first=(./inventory/ ./e2e/faults/ ./worker/ ./server/graphql/ ./e2e/ ./bench/flashsale/ ./resolvers/ ./cmd/dropline/ ./live/)

# A renamed test would silently leave the quiet pass for the loaded one:
# every name must still be a test of its package.
all=()
for dir in "${dirs[@]}"; do
	for name in ${QUIET[$dir]}; do
		if ! grep -qs "^func $name(t \*testing.T)" "$dir"/*_test.go; then
			echo "scripts/test.sh: $name is not a test of ./$dir; fix QUIET" >&2
			exit 1
		fi
		all+=("$name")
	done
done
alternatives() { local IFS='|'; echo "^($*)\$"; }

status=0
started=$SECONDS

# Pass 1. One `go test -c` builds the six binaries, two packages at a time
# (`go test -p 1` would compile and link them one after the other). Each
# then runs from its package's directory, as `go test` runs it.
quiet_pass() {
	local bin dir exe run t0 pkgs=()
	echo "== quiet pass: ${#all[@]} tests with wall-clock bounds, one package at a time, nothing beside them"
	bin="$(mktemp -d "${TMPDIR:-/tmp}/dropline-quiet-XXXXXX")"
	# shellcheck disable=SC2064 # the directory is known now
	trap "rm -rf '$bin'" EXIT
	for dir in "${dirs[@]}"; do
		pkgs+=("./$dir/")
	done
	"$GO" test -race -c -o "$bin/" "${pkgs[@]}" || status=1
	for dir in "${dirs[@]}"; do
		exe="$bin/$(basename "$dir").test"
		if [[ ! -x "$exe" ]]; then
			echo "FAIL	./$dir [build failed]"
			status=1
			continue
		fi
		# shellcheck disable=SC2086 # the names are words
		run="$(alternatives ${QUIET[$dir]})"
		t0=$SECONDS
		if (cd "$dir" && "$exe" -test.run "$run" -test.count=1 -test.timeout=20m -test.paniconexit0); then
			echo "ok  	./$dir	$((SECONDS - t0))s	(quiet pass)"
		else
			echo "FAIL	./$dir	$((SECONDS - t0))s	(quiet pass)"
			status=1
		fi
	done
	echo "== quiet pass: $((SECONDS - started))s"
}

# Pass 2.
rest_pass() {
	local t0=$SECONDS
	echo "== the rest of the suite, two packages at a time"
	"$GO" test -p 2 -race -count=1 -timeout 40m -skip "$(alternatives "${all[@]}")" "${first[@]}" ./... || status=1
	echo "== the rest: $((SECONDS - t0))s; the whole suite: $((SECONDS - started))s"
}

[[ "$only" == rest ]] || quiet_pass
[[ "$only" == quiet ]] || rest_pass
exit "$status"
