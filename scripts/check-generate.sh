#!/usr/bin/env bash
# scripts/check-generate.sh — `make check-generate`: run `go generate ./...`
# and fail when it changes or adds files. It compares the work tree before
# and after, so uncommitted edits of your own do not trip it; in CI's clean
# clone that is the same as "generate leaves no diff".
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo "check-generate: not a git work tree, skipped"
	exit 0
fi

snapshot() {
	git status --porcelain=v1 --untracked-files=all
	git diff --binary | sha256sum
	git ls-files --others --exclude-standard -z | xargs -0 -r sha256sum
}

before="$(snapshot)"
go generate ./...
after="$(snapshot)"

if [[ "$before" != "$after" ]]; then
	echo "check-generate: \`go generate ./...\` changed the tree; run \`make generate\` and commit the result:" >&2
	diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") >&2 || true
	git status --short >&2
	exit 1
fi
echo "check-generate: generated code is up to date"
