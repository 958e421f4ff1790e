package script

import (
	"context"

	"github.com/dropline/dropline/lua"
)

// JoinWaitlist is join_waitlist.lua's ARGV.
type JoinWaitlist struct {
	SKU, Principal string
	Quantity       int
	HoldMs         int64
	WaitlistMax    int
	Nonce          string
	MaxQuantity    int
	MinHoldMs      int64
	MaxHoldMs      int64
	Pass           string
}

// Call builds join_waitlist.lua's KEYS and ARGV.
func (a JoinWaitlist) Call(k Keys) Call {
	return Call{Script: lua.JoinWaitlist, Keys: k.waitlistKeys(a.SKU),
		Argv: []any{k.Base(k.PartitionOf(a.SKU)), a.SKU, a.Principal, a.Quantity, a.HoldMs, a.WaitlistMax, a.Nonce,
			a.MaxQuantity, a.MinHoldMs, a.MaxHoldMs, a.Pass}}
}

// RunJoinWaitlist runs join_waitlist.lua.
func RunJoinWaitlist(ctx context.Context, r Runner, k Keys, a JoinWaitlist) (Wait, error) {
	return run(ctx, r, a.Call(k), WaitOf)
}

// LeaveWaitlist is leave_waitlist.lua's ARGV.
type LeaveWaitlist struct {
	SKU, Principal string
}

// Call builds leave_waitlist.lua's KEYS and ARGV.
func (a LeaveWaitlist) Call(k Keys) Call {
	return Call{Script: lua.LeaveWaitlist, Keys: k.waitlistKeys(a.SKU), Argv: []any{a.SKU, a.Principal}}
}

// RunLeaveWaitlist runs leave_waitlist.lua.
func RunLeaveWaitlist(ctx context.Context, r Runner, k Keys, a LeaveWaitlist) (Wait, error) {
	return run(ctx, r, a.Call(k), WaitOf)
}

// ContinueWalk is continue_walk.lua's ARGV.
type ContinueWalk struct {
	Partition int
	SKU       string
	Nonce     string
}

// Call builds continue_walk.lua's KEYS and ARGV.
func (a ContinueWalk) Call(k Keys) Call {
	return Call{Script: lua.ContinueWalk, Keys: k.continueWalkKeys(a.Partition, a.SKU),
		Argv: []any{k.Base(a.Partition), a.SKU, a.Nonce}}
}

// ContinueWalkReply is continue_walk.lua's {DONE or PENDING, offers made}.
type ContinueWalkReply struct {
	Code   string
	Offers int
}

// RunContinueWalk runs continue_walk.lua.
func RunContinueWalk(ctx context.Context, r Runner, k Keys, a ContinueWalk) (ContinueWalkReply, error) {
	return run(ctx, r, a.Call(k), func(r Reply) ContinueWalkReply {
		return ContinueWalkReply{Code: r.Code(), Offers: int(r.Int(1))}
	})
}

// WaitlistEntry is one entry of a waitlist a rebuild stages.
type WaitlistEntry struct {
	Principal string
	Seq       int64
	Quantity  int
	HoldMs    int64
	Status    string // W or O
	Token     string
	JoinedMs  int64
}

// StageWaitlist is stage_waitlist.lua's ARGV: one chunk of a rebuild's waitlist.
type StageWaitlist struct {
	SKU        string
	Generation string
	StagingTTL int64
	MaxSeq     int64
	First      bool
	Entries    []WaitlistEntry
}

// Call builds stage_waitlist.lua's KEYS and ARGV.
func (a StageWaitlist) Call(k Keys) Call {
	first := "0"
	if a.First {
		first = "1"
	}
	argv := make([]any, 0, 4+7*len(a.Entries))
	argv = append(argv, a.Generation, a.StagingTTL, a.MaxSeq, first)
	for _, w := range a.Entries {
		argv = append(argv, w.Principal, w.Seq, w.Quantity, w.HoldMs, w.Status, w.Token, w.JoinedMs)
	}
	return Call{Script: lua.StageWaitlist, Keys: k.stageWaitlistKeys(a.SKU), Argv: argv}
}

// RunStageWaitlist runs stage_waitlist.lua: OK, EXISTS or STALE.
func RunStageWaitlist(ctx context.Context, r Runner, k Keys, a StageWaitlist) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}
