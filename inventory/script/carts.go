package script

import (
	"context"

	"github.com/dropline/dropline/lua"
)

// CartLine is one line of a cart as the cart scripts take it: a SKU, its
// units, and the token of the line's hold. The JSON names are how
// open_cart.lua keeps the lines (it stores them, never reads them).
type CartLine struct {
	SKU      string `json:"s"`
	Quantity int    `json:"q"`
	Token    string `json:"t"`
}

// OpenCart is open_cart.lua's ARGV, for a cart of home partition Home.
type OpenCart struct {
	Home           int
	Token          string
	Principal      string
	FP, Idem       string
	SettleMs       int64
	HoldMs         int64
	Lines          string // the lines, as the caller encodes them
	IdempotencyTTL int64
	Retention      int64
}

// Call builds open_cart.lua's KEYS and ARGV.
func (a OpenCart) Call(k Keys) Call {
	return Call{Script: lua.OpenCart, Keys: k.cartKeys(a.Home, a.Token, a.Idem),
		Argv: []any{k.Base(a.Home), a.Principal, a.FP, a.Idem, a.SettleMs, a.HoldMs, a.Lines, a.IdempotencyTTL,
			a.Retention, a.Token}}
}

// OpenCartReply is open_cart.lua's reply: {OK, token, who, status,
// created_ms, deadline_ms, expires_ms, lines, replayed}, {REFUSED,
// refusals, 1} (Refusals, as finish_cart.lua recorded them), or a
// business code alone.
type OpenCartReply struct {
	Code                   string
	Token, Who, Status     string
	CtdMs, DeadlineMs, Exp int64
	Lines                  string
	Replayed               bool
	Refusals               string
}

// OpenCartReplyOf decodes open_cart.lua's reply.
func OpenCartReplyOf(r Reply) OpenCartReply {
	switch r.Code() {
	case "OK":
		return OpenCartReply{Code: "OK", Token: r.Str(1), Who: r.Str(2), Status: r.Str(3), CtdMs: r.Int(4),
			DeadlineMs: r.Int(5), Exp: r.Int(6), Lines: r.Str(7), Replayed: r.Bool(8)}
	case "REFUSED":
		return OpenCartReply{Code: "REFUSED", Refusals: r.Str(1)}
	}
	return OpenCartReply{Code: r.Code()}
}

// RunOpenCart runs open_cart.lua.
func RunOpenCart(ctx context.Context, r Runner, k Keys, a OpenCart) (OpenCartReply, error) {
	return run(ctx, r, a.Call(k), OpenCartReplyOf)
}

// HoldCartLines is hold_cart_lines.lua's ARGV, for the lines of one
// partition.
type HoldCartLines struct {
	Partition   int
	Principal   string
	Cart        string
	DeadlineMs  int64
	MaxQuantity int
	Pass        string
	Lines       []CartLine
}

// Call builds hold_cart_lines.lua's KEYS and ARGV.
func (a HoldCartLines) Call(k Keys) Call {
	argv := make([]any, 0, 6+3*len(a.Lines))
	argv = append(argv, a.Principal, a.Cart, a.DeadlineMs, a.MaxQuantity, k.Base(a.Partition), a.Pass)
	for _, l := range a.Lines {
		argv = append(argv, l.SKU, l.Quantity, l.Token)
	}
	return Call{Script: lua.HoldCartLines, Keys: k.holdCartLinesKeys(a.Partition, a.Lines), Argv: argv}
}

// LineRefusal is one refused line of hold_cart_lines.lua: its 1-based
// position among the call's lines, and reserve's refusal {code, a, b}.
type LineRefusal struct {
	Line       int
	Code, A, B string
}

// HoldCartLinesReply is hold_cart_lines.lua's reply: {OK, replayed},
// {REFUSED, n, (line, code, a, b) x n}, {LATE}, or {NEEDS_HYDRATION or
// WALK_PENDING, sku} (Missing).
type HoldCartLinesReply struct {
	Code     string
	Refusals []LineRefusal
	Missing  string
}

// HoldCartLinesReplyOf decodes hold_cart_lines.lua's reply.
func HoldCartLinesReplyOf(r Reply) HoldCartLinesReply {
	out := HoldCartLinesReply{Code: r.Code()}
	switch out.Code {
	case "REFUSED":
		n := int(r.Int(1))
		out.Refusals = make([]LineRefusal, 0, n)
		for j := range n {
			at := 2 + 4*j
			out.Refusals = append(out.Refusals, LineRefusal{Line: int(r.Int(at)), Code: r.Str(at + 1), A: r.Str(at + 2), B: r.Str(at + 3)})
		}
	case codeNeedsHydration, "WALK_PENDING":
		out.Missing = r.missing()
	}
	return out
}

// RunHoldCartLines runs hold_cart_lines.lua.
func RunHoldCartLines(ctx context.Context, r Runner, k Keys, a HoldCartLines) (HoldCartLinesReply, error) {
	return run(ctx, r, a.Call(k), HoldCartLinesReplyOf)
}

// ConfirmCartLines is confirm_cart_lines.lua's ARGV, for the lines of one
// partition.
type ConfirmCartLines struct {
	Partition int
	Cart      string
	ExpiresMs int64
	Lines     []CartLine
}

// Call builds confirm_cart_lines.lua's KEYS and ARGV.
func (a ConfirmCartLines) Call(k Keys) Call {
	argv := make([]any, 0, 2+len(a.Lines))
	argv = append(argv, a.Cart, a.ExpiresMs)
	for _, l := range a.Lines {
		argv = append(argv, l.Token)
	}
	return Call{Script: lua.ConfirmCartLines, Keys: k.confirmCartLinesKeys(a.Partition, a.Lines), Argv: argv}
}

// RunConfirmCartLines runs confirm_cart_lines.lua: OK or LATE.
func RunConfirmCartLines(ctx context.Context, r Runner, k Keys, a ConfirmCartLines) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// FinishCart is finish_cart.lua's ARGV.
type FinishCart struct {
	Home         int
	Token, Idem  string
	Outcome      string // HELD, REFUSED or FAILED
	Refusals     string
	RejectionTTL int64
	Retention    int64
}

// Call builds finish_cart.lua's KEYS and ARGV.
func (a FinishCart) Call(k Keys) Call {
	return Call{Script: lua.FinishCart, Keys: k.cartKeys(a.Home, a.Token, a.Idem),
		Argv: []any{a.Token, a.Outcome, a.Refusals, a.RejectionTTL, a.Retention}}
}

// RunFinishCart runs finish_cart.lua.
func RunFinishCart(ctx context.Context, r Runner, k Keys, a FinishCart) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// AbandonCart is abandon_cart.lua's ARGV.
type AbandonCart struct {
	Home  int
	Token string
}

// Call builds abandon_cart.lua's KEYS and ARGV.
func (a AbandonCart) Call(k Keys) Call {
	return Call{Script: lua.AbandonCart, Keys: k.abandonCartKeys(a.Home, a.Token), Argv: []any{a.Token}}
}

// AbandonCartReply is abandon_cart.lua's {OK or EXPIRED, who, lines}, or a
// code alone.
type AbandonCartReply struct {
	Code       string
	Who, Lines string
}

// AbandonCartReplyOf decodes abandon_cart.lua's reply.
func AbandonCartReplyOf(r Reply) AbandonCartReply {
	return AbandonCartReply{Code: r.Code(), Who: r.Str(1), Lines: r.Str(2)}
}

// ExtendCart is extend_cart.lua's ARGV.
type ExtendCart struct {
	Home      int
	Token     string
	ExpiresMs int64
	Retention int64
}

// Call builds extend_cart.lua's KEYS and ARGV.
func (a ExtendCart) Call(k Keys) Call {
	return Call{Script: lua.ExtendCart, Keys: k.abandonCartKeys(a.Home, a.Token), Argv: []any{a.Token, a.ExpiresMs, a.Retention}}
}

// RunExtendCart runs extend_cart.lua.
func RunExtendCart(ctx context.Context, r Runner, k Keys, a ExtendCart) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}
