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
# A test with a wall-clock bound marks itself: its first statement is
# `testenv.Quiet(t)` (internal/testenv/quiet.go). This script reads those
# marks from the code to make the quiet pass, and pass 2 skips exactly those
# tests; there is no list to keep. Quiet fails a marked test that still
# reaches pass 2 (a mark written where this script cannot see it), so a
# bounded test is never measured under load unnoticed. Both passes always
# run, and either failing fails the run.
#
#   bash scripts/test.sh          both passes (make test)
#   bash scripts/test.sh quiet    the quiet pass alone
#   bash scripts/test.sh rest     the rest alone
#   bash scripts/test.sh list     print the quiet tests, by package
set -uo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
only="${1:-}"
case "$only" in
"" | quiet | rest | list) ;;
*)
	echo "usage: scripts/test.sh [quiet|rest|list]" >&2
	exit 2
	;;
esac

# The quiet tests, read from their marks: "dir name" for every statement
# `testenv.Quiet(t)`, named after the top-level function it is in (gofmt
# writes every top-level func at column 0, so the last `func` line above a
# statement opens the function holding it, subtest closures included).
marks() {
	local files
	mapfile -t files < <(grep -rlE --include='*_test.go' --exclude-dir=node_modules \
		'^[[:space:]]+testenv\.Quiet\([[:alnum:]_]+\)[[:space:]]*(//.*)?$' . | sort)
	((${#files[@]} > 0)) || return 0
	awk '
		/^func / { fn = $2; sub(/\(.*/, "", fn) }
		/^[ \t]+testenv\.Quiet\([A-Za-z0-9_]+\)[ \t]*(\/\/.*)?$/ { f = FILENAME; sub(/^\.\//, "", f); sub(/\/[^\/]*$/, "", f); print f, fn }
	' "${files[@]}"
}

# dirs lists the packages with quiet tests; QUIET their tests, by package.
dirs=()
declare -A QUIET=()
all=()
while read -r dir name; do
	if [[ ! "$name" =~ ^Test ]]; then
		echo "scripts/test.sh: testenv.Quiet is called in ${name:-a method} in ./$dir, not in a Test function: call it in the test itself" >&2
		exit 1
	fi
	[[ -v "QUIET[$dir]" ]] || dirs+=("$dir")
	QUIET[$dir]+=" $name"
	all+=("$name")
done < <(marks)
alternatives() { local IFS='|'; echo "^($*)\$"; }

# Pass 2 skips by name in every package: a test of another package with a
# quiet test's name would never run.
if ((${#all[@]} > 0)); then
	while IFS=: read -r file _ line; do
		dir="$(dirname "${file#./}")"
		name="${line#func }"
		name="${name%%(*}"
		if [[ " ${QUIET[$dir]:-} " != *" $name "* ]]; then
			echo "scripts/test.sh: ./$dir has a test named $name, like a quiet test of another package: pass 2 would skip it; rename one" >&2
			exit 1
		fi
	done < <(grep -rnE --include='*_test.go' --exclude-dir=node_modules "^func ($(IFS='|'; echo "${all[*]}"))\(" .)
fi

if [[ "$only" == list ]]; then
	for dir in "${dirs[@]}"; do
		echo "./$dir:${QUIET[$dir]}"
	done
	exit 0
fi

# The packages the rest of the suite starts with: the longest, so that the
# last minutes are not one long package running alone.
first=(./inventory/ ./e2e/faults/ ./worker/ ./server/graphql/ ./e2e/ ./bench/flashsale/ ./resolvers/ ./cmd/dropline/ ./live/)

status=0
started=$SECONDS

# Pass 1. One `go test -c` builds their binaries, two packages at a time
# (`go test -p 1` would compile and link them one after the other). Each
# then runs from its package's directory, as `go test` runs it, one test
# at a time: a quiet test that calls t.Parallel (or has parallel subtests)
# would otherwise run beside the package's other quiet tests.
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
		if (cd "$dir" && DROPLINE_TEST_PASS=quiet "$exe" -test.run "$run" -test.count=1 -test.parallel=1 -test.timeout=20m -test.paniconexit0); then
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
	DROPLINE_TEST_PASS=loaded "$GO" test -p 2 -race -count=1 -timeout 40m -skip "$(alternatives "${all[@]}")" "${first[@]}" ./... || status=1
	echo "== the rest: $((SECONDS - t0))s; the whole suite: $((SECONDS - started))s"
}

[[ "$only" == rest ]] || quiet_pass
[[ "$only" == quiet ]] || rest_pass
exit "$status"
