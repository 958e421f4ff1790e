// Package lua holds Dropline's Redis scripts. Each script is one atomic step of
// the inventory engine or of the worker group's leases; lib.lua is prepended
// to every one of them (the definitions each reaches: shake), so shared
// helpers need no second round trip.
//
// Every script opens with its contract: its KEYS in a fixed order, its ARGV,
// its reply codes, and why it must be one script. The Go side builds the KEYS
// in that order in one place (package inventory/script for the engine's scripts,
// worker/keys.go for the leases').
//
// The library starts with the sale policy, rendered from package
// inventory/policy (policyLua): which modes admit which path, which limits
// each path is held to, and each mode's refusal. lib.lua's may_take reads it,
// so the scripts decide with the rules the Go package defines.
//
// This package imports nothing of Dropline's but inventory/policy (a leaf
// that knows nothing of Redis), and knows nothing of Redis clients. Package inventory imports it for the engine's scripts and
// package worker for its lease scripts (Lease stays in worker, the only user
// of leases; moving it into inventory would make the engine own the worker
// group's scheduling). Dependencies keep pointing inward: worker -> inventory
// -> lua, and worker -> lua, never the other way.
package lua

import (
	"embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/dropline/dropline/inventory/policy"
)

//go:embed *.lua
var files embed.FS

// Names of the scripts, as the engine loads them.
const (
	Reserve      = "reserve"
	BeginCommit  = "begin_commit"
	FinishCommit = "finish_commit"
	ReleaseHold  = "release_hold"
	// ExtendHold gives a HELD hold a later expiry, within bounds.
	ExtendHold   = "extend_hold"
	StageRebuild = "stage_rebuild"
	HydrateSKU   = "hydrate_sku"
	PublishSKU   = "publish_sku"
	ApplyProduct = "apply_product"
	// ApplyDrop writes a drop's settings and SKU list, version-guarded.
	ApplyDrop = "apply_drop"
	DueHolds  = "due_holds"
	// ReconcileHold tells Redis what the ledger says of one hold.
	ReconcileHold = "reconcile_hold"
	// AckApplied acknowledges an applied outbox batch when no SKU of it was
	// rebuilt meanwhile.
	AckApplied = "ack_applied"
	// ClaimIdempotencyKey pins an idempotency key to its first SKU.
	ClaimIdempotencyKey = "claim_idempotency_key"
	// StageWaitlist writes a chunk of a rebuild's waitlist.
	StageWaitlist = "stage_waitlist"
	// JoinWaitlist puts a principal in a SKU's waitlist (or replays its entry).
	JoinWaitlist = "join_waitlist"
	// LeaveWaitlist takes a principal out of a SKU's waitlist.
	LeaveWaitlist = "leave_waitlist"
	// OpenCart records a cart as PENDING, or replays its idempotency key.
	OpenCart = "open_cart"
	// HoldCartLines holds a cart's lines of one partition provisionally.
	HoldCartLines = "hold_cart_lines"
	// ConfirmCartLines gives a cart's provisional holds of one partition the cart's expiry.
	ConfirmCartLines = "confirm_cart_lines"
	// FinishCart records how reserving a cart ended.
	FinishCart = "finish_cart"
	// AbandonCart lets go of a cart left PENDING past its deadline.
	AbandonCart = "abandon_cart"
	// ExtendCart records a cart's new expiry once every line has it.
	ExtendCart = "extend_cart"
	// ApplyDraw writes one batch of a draw's result: winners' holds, losers' places.
	ApplyDraw = "apply_draw"
	// RateLimit spends one unit of a principal's mutation budget.
	RateLimit = "rate_limit"
	// ContinueWalk takes a SKU's unfinished waitlist walk one bounded run further.
	ContinueWalk = "continue_walk"
)

// Names of the admission queue's scripts (package inventory/queue).
const (
	// RestoreQueue loads a queue into Redis from the ledger (its settings,
	// and after a loss its tickets and passes), unless it is there.
	RestoreQueue = "restore_queue"
	// JoinQueue gives a principal its ticket, or its ticket again.
	JoinQueue = "join_queue"
	// NumberQueue writes a batch of a shuffled pre-queue's numbers.
	NumberQueue = "number_queue"
	// AdmitQueue admits the next tickets, as the rate and the stock allow.
	AdmitQueue = "admit_queue"
)

// Queue lists the admission queue's scripts.
var Queue = []string{RestoreQueue, JoinQueue, NumberQueue, AdmitQueue}

// Names of the worker group's lease scripts.
const (
	// LeaseAcquire takes a lease and draws its fencing token.
	LeaseAcquire = "lease_acquire"
	// LeaseRenew extends a lease for its owner.
	LeaseRenew = "lease_renew"
	// LeaseRelease deletes a lease for its owner.
	LeaseRelease = "lease_release"
	// LeaseMembers records a live member of a worker kind and counts them.
	LeaseMembers = "lease_members"
)

// Engine lists the inventory engine's scripts, which it loads at start-up.
var Engine = []string{Reserve, BeginCommit, FinishCommit, ReleaseHold, ExtendHold, StageRebuild, HydrateSKU, PublishSKU, ApplyProduct, ApplyDrop, DueHolds,
	ReconcileHold, AckApplied, ClaimIdempotencyKey, StageWaitlist, JoinWaitlist, LeaveWaitlist, OpenCart, HoldCartLines, ConfirmCartLines, FinishCart, AbandonCart, ExtendCart, ApplyDraw, RateLimit, ContinueWalk}

// Leases lists the worker group's lease scripts.
var Leases = []string{LeaseAcquire, LeaseRenew, LeaseRelease, LeaseMembers}

// All lists every script name, for tests.
var All = append(append(append([]string{}, Engine...), Queue...), Leases...)

// Source returns the full text of a script: the policy (policyLua), lib.lua,
// then the script.
func Source(name string) (string, error) {
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %s: %w", name, err)
	}
	return withLibrary(string(body))
}

// withLibrary prepends the policy and lib.lua to a script's body: those of
// their definitions the body reaches (shake).
func withLibrary(body string) (string, error) {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		return "", fmt.Errorf("reading lib.lua: %w", err)
	}
	var b strings.Builder
	b.WriteString(shake(policyLua()+string(lib), body))
	b.WriteString("\n")
	b.WriteString(body)
	return b.String(), nil
}

// policyLua renders package policy's tables as Lua, in the policy's own
// order (so a script's text, and its SHA, never change between builds):
//
//	policy_admits[mode][path]  true when the mode lets the path take units
//	policy_limits[path]        the limits the path is held to, in order
//	policy_refusal[mode]       {code, a, b}: how the mode refuses a path it does not admit
//	policy_pass[mode]          true when the mode holds paths to the admission pass limit
func policyLua() string {
	var b strings.Builder
	b.WriteString("-- The sale policy, rendered by lua/lua.go from package inventory/policy\n" +
		"-- (never edit it here): see may_take in lib.lua.\n")
	b.WriteString("local policy_admits = {\n")
	for _, m := range policy.Modes {
		fmt.Fprintf(&b, "  [%s] = {", strconv.Quote(string(m)))
		for _, p := range policy.Paths {
			if policy.Admits(m, p) {
				fmt.Fprintf(&b, " [%s] = true,", strconv.Quote(string(p)))
			}
		}
		b.WriteString(" },\n")
	}
	b.WriteString("}\nlocal policy_limits = {\n")
	for _, p := range policy.Paths {
		fmt.Fprintf(&b, "  [%s] = {", strconv.Quote(string(p)))
		for _, l := range policy.Limits {
			if policy.Applies(p, l) {
				fmt.Fprintf(&b, " %s,", strconv.Quote(string(l)))
			}
		}
		b.WriteString(" },\n")
	}
	b.WriteString("}\nlocal policy_refusal = {\n")
	for _, m := range policy.Modes {
		r := policy.Refuse(m)
		fmt.Fprintf(&b, "  [%s] = { %s, %s, %s },\n", strconv.Quote(string(m)), strconv.Quote(string(r.Code)),
			strconv.Quote(r.A), strconv.Quote(r.B))
	}
	b.WriteString("}\nlocal policy_pass = {")
	for _, m := range policy.Modes {
		if policy.NeedsPass(m) {
			fmt.Fprintf(&b, " [%s] = true,", strconv.Quote(string(m)))
		}
	}
	b.WriteString(" }\n\n")
	return b.String()
}

// MustSource is Source for a script of this package, which is embedded: it
// panics only when name is not one of the names above.
func MustSource(name string) string {
	src, err := Source(name)
	if err != nil {
		panic(err)
	}
	return src
}
