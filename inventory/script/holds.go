package script

import (
	"context"
	"fmt"
	"slices"

	"github.com/dropline/dropline/lua"
)

// ReserveRequest is one request of a reserve.lua batch: its one key and
// nine ARGV, its share of the SKUs and budgets the batch names once (and its
// traceparent, sent only when a request of the batch is traced).
type ReserveRequest struct {
	SKU, Principal string
	Quantity       int
	HoldMs         int64
	Token          string
	Fingerprint    string // "" without an idempotency key
	Idem           string // idempotency hash, "" for none
	// BudgetKey is the principal's mutation budget when this run spends it
	// ("" when it does not), Budget its burst, rate and period ("" each).
	BudgetKey   string
	Budget      [3]any
	Pass        string
	Traceparent string
}

// Reserve is reserve.lua's ARGV head and its batch of requests, all of
// partition Partition.
type Reserve struct {
	Partition      int
	IdempotencyTTL int64 // seconds
	MaxQuantity    int
	MaxHoldMs      int64
	RejectionTTL   int64 // seconds
	Requests       []ReserveRequest
}

// reserveRequestArgs is how many ARGV each request has.
const reserveRequestArgs = 9

// Call builds reserve.lua's KEYS and ARGV. The SKUs and budgets of the
// batch are named once each, in the order the requests first name them
// (a batch mostly has one of each): every argument costs Redis about as
// much to read as a small command does.
func (a Reserve) Call(k Keys) Call {
	n := len(a.Requests)
	traced := false
	var skus []string
	var budgets [][3]any
	for i := range a.Requests {
		r := &a.Requests[i]
		traced = traced || r.Traceparent != ""
		if !slices.Contains(skus, r.SKU) {
			skus = append(skus, r.SKU)
		}
		if r.BudgetKey != "" && !slices.Contains(budgets, r.Budget) {
			budgets = append(budgets, r.Budget)
		}
	}
	size := 7 + len(skus) + 3*len(budgets) + reserveRequestArgs*n
	if traced {
		size += n
	}
	keys := make([]string, 0, 2+3*len(skus)+n)
	keys = append(keys, k.Expiry(a.Partition), k.Outbox(a.Partition))
	argv := make([]any, 0, size)
	argv = append(argv, k.Base(a.Partition), a.IdempotencyTTL, a.MaxQuantity, a.MaxHoldMs, a.RejectionTTL,
		len(skus), len(budgets))
	for _, sku := range skus {
		keys = append(keys, k.skuIn(a.Partition, sku), k.quotaIn(a.Partition, sku), k.channelIn(a.Partition, sku))
		argv = append(argv, sku)
	}
	for _, b := range budgets {
		argv = append(argv, b[0], b[1], b[2])
	}
	for i := range a.Requests {
		r := &a.Requests[i]
		// The budget is named by its number among the batch's (1, 2 ...).
		var budget any = ""
		if r.BudgetKey != "" {
			budget = slices.Index(budgets, r.Budget) + 1
		}
		keys = append(keys, k.reserveBudgetKey(a.Partition, r.BudgetKey))
		argv = append(argv, r.SKU, r.Principal, r.Quantity, r.HoldMs, r.Token, r.Fingerprint, r.Idem, budget, r.Pass)
	}
	if traced {
		for i := range a.Requests {
			argv = append(argv, a.Requests[i].Traceparent)
		}
	}
	return Call{Script: lua.Reserve, Keys: keys, Argv: argv}
}

// ReserveReply is reserve.lua's reply to one request: HELD with the hold's
// expiry and the run's clock for a hold the run made, hold_reply OK for a
// replay (Hold), {NEEDS_HYDRATION or WALK_PENDING, sku} (Missing), {ERR,
// message} (Message), or a rejection (RATE_LIMITED's A is the seconds to
// wait).
type ReserveReply struct {
	Code                 string
	ExpiresMs, CreatedMs int64
	Hold                 Hold
	Missing              string
	Message              string
	Rejection            Rejection
}

// ReserveRepliesOf decodes reserve.lua's reply to a batch of n requests:
// the run's clock, then per request a hold's expiry (a number) for a hold
// the run made, or a list.
func ReserveRepliesOf(res []any, n int) ([]ReserveReply, error) {
	if len(res) != n+1 {
		return nil, fmt.Errorf("script %s answered %d replies for %d requests", lua.Reserve, len(res)-1, n)
	}
	created, ok := res[0].(int64)
	if !ok {
		return nil, fmt.Errorf("script %s answered %v for its clock", lua.Reserve, res[0])
	}
	out := make([]ReserveReply, n)
	for i, x := range res[1:] {
		switch r := x.(type) {
		case int64:
			out[i] = ReserveReply{Code: "HELD", ExpiresMs: r, CreatedMs: created}
		case []any:
			if len(r) == 0 {
				return nil, fmt.Errorf("script %s answered an empty list for request %d", lua.Reserve, i)
			}
			out[i] = ReserveReplyOf(r)
		default:
			return nil, fmt.Errorf("script %s answered %v for request %d", lua.Reserve, x, i)
		}
	}
	return out, nil
}

// ReserveReplyOf decodes one request's list reply of reserve.lua (every
// reply but a hold the run made).
func ReserveReplyOf(r Reply) ReserveReply {
	out := ReserveReply{Code: r.Code()}
	switch out.Code {
	case "OK":
		out.Hold = HoldOf(r)
	case codeNeedsHydration, "WALK_PENDING":
		out.Missing = r.missing()
	case "ERR":
		out.Message = r.Str(1)
	default:
		out.Rejection = rejectionOf(r)
	}
	return out
}

// BeginCommit is begin_commit.lua's ARGV; the hold is known by token only.
type BeginCommit struct {
	Partition int
	Token     string
	Principal string
	Retention int64 // seconds
	Attempt   string
	Nonce     string
}

// Call builds begin_commit.lua's KEYS and ARGV.
func (a BeginCommit) Call(k Keys) Call {
	return Call{Script: lua.BeginCommit, Keys: k.tokenHoldKeys(a.Partition, a.Token),
		Argv: []any{k.Base(a.Partition), a.Token, a.Principal, a.Retention, a.Attempt, a.Nonce}}
}

// BeginCommitReply is begin_commit.lua's reply: a hold_reply, to which OK
// adds {attempt id, moved (1/0), idempotency hash, request fingerprint}.
type BeginCommitReply struct {
	Hold
	AttemptID string
	Moved     bool
	Idem, FP  string
}

// BeginCommitReplyOf decodes begin_commit.lua's reply.
func BeginCommitReplyOf(r Reply) BeginCommitReply {
	out := BeginCommitReply{Hold: HoldOf(r)}
	if out.Code == "OK" {
		out.AttemptID, out.Moved, out.Idem, out.FP = r.Str(12), r.Bool(13), r.Str(14), r.Str(15)
	}
	return out
}

// RunBeginCommit runs begin_commit.lua.
func RunBeginCommit(ctx context.Context, r Runner, k Keys, a BeginCommit) (BeginCommitReply, error) {
	return run(ctx, r, a.Call(k), BeginCommitReplyOf)
}

// FinishCommit is finish_commit.lua's ARGV.
type FinishCommit struct {
	Partition   int
	Token       string
	Outcome     string // COMMITTED, RESTORE, REFUSED, CANCELLED or EXPIRED
	Retention   int64
	SKU         string
	Principal   string
	Quantity    int
	CommittedMs int64
	Attempt     string
	Nonce       string
}

// Call builds finish_commit.lua's KEYS and ARGV.
func (a FinishCommit) Call(k Keys) Call {
	return Call{Script: lua.FinishCommit, Keys: k.finishCommitKeys(a.Partition, a.Token, a.SKU),
		Argv: []any{a.Token, a.Outcome, a.Retention, a.SKU, a.Principal, a.Quantity, a.CommittedMs, a.Attempt,
			k.Base(a.Partition), a.Nonce}}
}

// ReleaseHold is release_hold.lua's ARGV: a cancel (Status CANCELLED, by
// Principal) or an expiry (EXPIRED, Principal "").
type ReleaseHold struct {
	Partition    int
	Token        string
	Principal    string
	Admin        bool
	Status       string
	Retention    int64
	Nonce        string
	RejectionTTL int64
}

// Call builds release_hold.lua's KEYS and ARGV.
func (a ReleaseHold) Call(k Keys) Call {
	admin := "0"
	if a.Admin {
		admin = "1"
	}
	return Call{Script: lua.ReleaseHold, Keys: k.tokenHoldKeys(a.Partition, a.Token),
		Argv: []any{k.Base(a.Partition), a.Token, a.Principal, admin, a.Status, a.Retention, a.Nonce, a.RejectionTTL}}
}

// RunReleaseHold runs release_hold.lua.
func RunReleaseHold(ctx context.Context, r Runner, k Keys, a ReleaseHold) (Hold, error) {
	return run(ctx, r, a.Call(k), HoldOf)
}

// ExtendHold is extend_hold.lua's ARGV.
type ExtendHold struct {
	Partition     int
	Token         string
	Principal     string
	HoldMs        int64
	MaxExtensions int
	MaxHoldMs     int64
	CallID        string
	Retention     int64
	Idem, FP      string
}

// Call builds extend_hold.lua's KEYS and ARGV.
func (a ExtendHold) Call(k Keys) Call {
	return Call{Script: lua.ExtendHold, Keys: k.extendHoldKeys(a.Partition, a.Token),
		Argv: []any{k.Base(a.Partition), a.Token, a.Principal, a.HoldMs, a.MaxExtensions, a.MaxHoldMs, a.CallID,
			a.Retention, a.Idem, a.FP}}
}

// RunExtendHold runs extend_hold.lua.
func RunExtendHold(ctx context.Context, r Runner, k Keys, a ExtendHold) (Hold, error) {
	return run(ctx, r, a.Call(k), HoldOf)
}

// DueHolds is due_holds.lua's ARGV.
type DueHolds struct {
	Partition int
	Limit     int
}

// Call builds due_holds.lua's KEYS and ARGV.
func (a DueHolds) Call(k Keys) Call {
	return Call{Script: lua.DueHolds, Keys: k.dueHoldsKeys(a.Partition), Argv: []any{a.Limit}}
}

// DueHoldsReply is due_holds.lua's {now_ms, token...}.
type DueHoldsReply struct {
	NowMs  int64
	Tokens []string
}

// DueHoldsReplyOf decodes due_holds.lua's reply.
func DueHoldsReplyOf(r Reply) DueHoldsReply {
	out := DueHoldsReply{NowMs: r.Int(0)}
	for i := 1; i < len(r); i++ {
		if s, ok := r[i].(string); ok {
			out.Tokens = append(out.Tokens, s)
		}
	}
	return out
}

// RunDueHolds runs due_holds.lua.
func RunDueHolds(ctx context.Context, r Runner, k Keys, a DueHolds) (DueHoldsReply, error) {
	return run(ctx, r, a.Call(k), DueHoldsReplyOf)
}

// ReconcileHold is reconcile_hold.lua's ARGV: what the ledger says of one hold.
type ReconcileHold struct {
	Partition            int
	Token, Status, SKU   string
	Principal            string
	Quantity             int
	ExpiresMs, CreatedMs int64
	Idem, FP             string
	Retention            int64
	IdempotencyTTL       int64
	Extensions           int
	Nonce                string
	// Dropped says the ledger's HELD row is marked dropped (a rebuild
	// recorded the hold as expired): the script never counts it as held.
	Dropped bool
}

// Call builds reconcile_hold.lua's KEYS and ARGV.
func (a ReconcileHold) Call(k Keys) Call {
	dropped := ""
	if a.Dropped {
		dropped = "1"
	}
	return Call{Script: lua.ReconcileHold, Keys: k.reconcileHoldKeys(a.Partition, a.Token, a.SKU, a.Idem),
		Argv: []any{a.Token, a.Status, a.SKU, a.Principal, a.Quantity, a.ExpiresMs, a.CreatedMs, a.Idem, a.FP,
			a.Retention, a.IdempotencyTTL, a.Extensions, k.Base(a.Partition), a.Nonce, dropped}}
}

// ReconcileReply is reconcile_hold.lua's reply: AGREES, RELEASED, ADOPTED,
// CLOSED or RESTATED, {code, status, ended_ms, expires_ms, extensions} when it names
// an ending (CLOSED, or AGREES with Redis' ending), or {NEEDS_HYDRATION, sku}.
type ReconcileReply struct {
	Code               string
	Status             string
	EndedMs, ExpiresMs int64
	Extensions         int
	Missing            string
}

// ReconcileReplyOf decodes reconcile_hold.lua's reply.
func ReconcileReplyOf(r Reply) ReconcileReply {
	if r.Code() == codeNeedsHydration {
		return ReconcileReply{Code: codeNeedsHydration, Missing: r.missing()}
	}
	return ReconcileReply{Code: r.Code(), Status: r.Str(1), EndedMs: r.Int(2), ExpiresMs: r.Int(3), Extensions: int(r.Int(4))}
}

// RunReconcileHold runs reconcile_hold.lua.
func RunReconcileHold(ctx context.Context, r Runner, k Keys, a ReconcileHold) (ReconcileReply, error) {
	return run(ctx, r, a.Call(k), ReconcileReplyOf)
}

// ClaimIdempotencyKey is claim_idempotency_key.lua's ARGV.
type ClaimIdempotencyKey struct {
	Idem    string
	SKU     string
	TTL     int64 // seconds
	Checked bool  // the caller has checked the ledger
	Mark    string
}

// Call builds claim_idempotency_key.lua's KEYS and ARGV.
func (a ClaimIdempotencyKey) Call(k Keys) Call {
	checked := "0"
	if a.Checked {
		checked = "1"
	}
	return Call{Script: lua.ClaimIdempotencyKey, Keys: k.claimKeys(a.Idem), Argv: []any{a.SKU, a.TTL, checked, a.Mark}}
}

// ClaimReply is claim_idempotency_key.lua's reply: OK, MARK, CHECK, or
// {REUSED, sku} (SKU).
type ClaimReply struct {
	Code string
	SKU  string
}

// RunClaimIdempotencyKey runs claim_idempotency_key.lua.
func RunClaimIdempotencyKey(ctx context.Context, r Runner, k Keys, a ClaimIdempotencyKey) (ClaimReply, error) {
	return run(ctx, r, a.Call(k), func(r Reply) ClaimReply { return ClaimReply{Code: r.Code(), SKU: r.Str(1)} })
}

// RateLimit is rate_limit.lua's ARGV: spend Cost units of the budget at Key.
type RateLimit struct {
	Key    string
	Budget [3]any // burst, rate, period in seconds
	Cost   int
}

// Call builds rate_limit.lua's KEYS and ARGV.
func (a RateLimit) Call(Keys) Call {
	return Call{Script: lua.RateLimit, Keys: []string{a.Key}, Argv: []any{a.Budget[0], a.Budget[1], a.Budget[2], a.Cost}}
}

// RateLimitReply is rate_limit.lua's {1} (spent) or {0, retry_after seconds}.
type RateLimitReply struct {
	Spent      bool
	RetryAfter string
}

// RateLimitReplyOf decodes rate_limit.lua's reply.
func RateLimitReplyOf(r Reply) RateLimitReply {
	return RateLimitReply{Spent: r.Int(0) == 1, RetryAfter: r.Str(1)}
}
