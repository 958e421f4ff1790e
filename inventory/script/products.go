package script

import (
	"context"
	"strings"

	"github.com/dropline/dropline/lua"
)

// ApplyProduct is apply_product.lua's ARGV: a product's settings, written
// version-guarded.
type ApplyProduct struct {
	SKU               string
	Version           int64
	Total, MaxPerUser int
	StartsMs, EndsMs  int64 // 0: none
	Nonce             string
}

// Call builds apply_product.lua's KEYS and ARGV.
func (a ApplyProduct) Call(k Keys) Call {
	return Call{Script: lua.ApplyProduct, Keys: k.applyProductKeys(a.SKU),
		Argv: []any{a.SKU, a.Version, a.Total, a.MaxPerUser, a.StartsMs, a.EndsMs, k.Base(k.PartitionOf(a.SKU)), a.Nonce}}
}

// RunApplyProduct runs apply_product.lua: OK, STALE or NEEDS_HYDRATION.
func RunApplyProduct(ctx context.Context, r Runner, k Keys, a ApplyProduct) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// ApplyDrop is apply_drop.lua's ARGV: a drop's settings and SKUs.
type ApplyDrop struct {
	Drop             string
	Version          int64
	MaxPerUser       int
	StartsMs, EndsMs int64
	SKUs             []string
}

// Call builds apply_drop.lua's KEYS and ARGV.
func (a ApplyDrop) Call(k Keys) Call {
	return Call{Script: lua.ApplyDrop, Keys: []string{k.Drop(a.Drop)},
		Argv: []any{a.Version, a.MaxPerUser, a.StartsMs, a.EndsMs, strings.Join(a.SKUs, " ")}}
}

// RunApplyDrop runs apply_drop.lua: OK or STALE.
func RunApplyDrop(ctx context.Context, r Runner, k Keys, a ApplyDrop) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// StageRebuild is stage_rebuild.lua's ARGV.
type StageRebuild struct {
	SKU        string
	StagingTTL int64 // seconds
}

// Call builds stage_rebuild.lua's KEYS and ARGV.
func (a StageRebuild) Call(k Keys) Call {
	return Call{Script: lua.StageRebuild, Keys: k.stageRebuildKeys(a.SKU), Argv: []any{a.StagingTTL}}
}

// StageRebuildReply is stage_rebuild.lua's {OK, gen} or {EXISTS}.
type StageRebuildReply struct {
	Code       string
	Generation string
}

// RunStageRebuild runs stage_rebuild.lua.
func RunStageRebuild(ctx context.Context, r Runner, k Keys, a StageRebuild) (StageRebuildReply, error) {
	return run(ctx, r, a.Call(k), func(r Reply) StageRebuildReply {
		return StageRebuildReply{Code: r.Code(), Generation: r.Str(1)}
	})
}

// HydrateHold is one hold of a hydrate_sku.lua chunk, as its header lists
// the fields.
type HydrateHold struct {
	Token, Principal     string
	Quantity             int
	Status               string
	ExpiresMs, CreatedMs int64
	CommittedMs, EndedMs int64
	Idem, FP             string
	Extensions           int
}

// HydrateHoldFields is how many ARGV one HydrateHold takes.
const HydrateHoldFields = 11

// QuotaCount is one principal's units of a hydrate_sku.lua chunk.
type QuotaCount struct {
	Principal string
	Units     int
}

// HydrateSKU is hydrate_sku.lua's ARGV: chunk number Chunk of a rebuild.
type HydrateSKU struct {
	SKU            string
	Generation     string
	Chunk          int
	Retention      int64
	IdempotencyTTL int64
	StagingTTL     int64
	Holds          []HydrateHold
	Quota          []QuotaCount
}

// Call builds hydrate_sku.lua's KEYS and ARGV.
func (a HydrateSKU) Call(k Keys) Call {
	argv := make([]any, 0, 9+HydrateHoldFields*len(a.Holds)+2*len(a.Quota))
	argv = append(argv, k.Base(k.PartitionOf(a.SKU)), a.SKU, a.Generation, a.Chunk, a.Retention, a.IdempotencyTTL,
		a.StagingTTL, len(a.Holds))
	for _, h := range a.Holds {
		argv = append(argv, h.Token, h.Principal, h.Quantity, h.Status, h.ExpiresMs, h.CreatedMs, h.CommittedMs,
			h.EndedMs, h.Idem, h.FP, h.Extensions)
	}
	argv = append(argv, len(a.Quota))
	for _, q := range a.Quota {
		argv = append(argv, q.Principal, q.Units)
	}
	return Call{Script: lua.HydrateSKU, Keys: k.hydrateKeys(a.SKU), Argv: argv}
}

// RunHydrateSKU runs hydrate_sku.lua: OK, DONE, EXISTS or STALE.
func RunHydrateSKU(ctx context.Context, r Runner, k Keys, a HydrateSKU) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// PublishSKU is publish_sku.lua's ARGV: the rebuilt SKU made live.
type PublishSKU struct {
	SKU              string
	Generation       string
	Chunks           int
	Total, Sold      int
	MaxPerUser       int
	StartsMs, EndsMs int64
	Version          int64
	Held, Available  int
	Nonce            string
	Drop             string
	Mode             string
}

// Call builds publish_sku.lua's KEYS and ARGV.
func (a PublishSKU) Call(k Keys) Call {
	return Call{Script: lua.PublishSKU, Keys: k.publishKeys(a.SKU),
		Argv: []any{a.SKU, a.Generation, a.Chunks, a.Total, a.Sold, a.MaxPerUser, a.StartsMs, a.EndsMs, a.Version,
			a.Held, a.Available, k.Base(k.PartitionOf(a.SKU)), a.Nonce, a.Drop, a.Mode}}
}

// RunPublishSKU runs publish_sku.lua: OK, EXISTS or STALE.
func RunPublishSKU(ctx context.Context, r Runner, k Keys, a PublishSKU) (Result, error) {
	return run(ctx, r, a.Call(k), ResultOf)
}

// AckApplied is ack_applied.lua's ARGV: acknowledge Ids of partition
// Partition's outbox for Group, unless a SKU's generation moved on.
type AckApplied struct {
	Partition   int
	Group       string
	SKUs        []string
	Generations []string // the generation the batch's events of SKUs[i] carry
	IDs         []string
}

// Call builds ack_applied.lua's KEYS and ARGV.
func (a AckApplied) Call(k Keys) Call {
	keys := make([]string, 0, 1+len(a.SKUs))
	keys = append(keys, k.Outbox(a.Partition))
	argv := make([]any, 0, 2+len(a.Generations)+len(a.IDs))
	argv = append(argv, a.Group, len(a.SKUs))
	for i, sku := range a.SKUs {
		keys = append(keys, k.skuIn(a.Partition, sku))
		argv = append(argv, a.Generations[i])
	}
	for _, id := range a.IDs {
		argv = append(argv, id)
	}
	return Call{Script: lua.AckApplied, Keys: keys, Argv: argv}
}

// RunAckApplied runs ack_applied.lua: true when it acknowledged ({1}).
func RunAckApplied(ctx context.Context, r Runner, k Keys, a AckApplied) (bool, error) {
	return run(ctx, r, a.Call(k), func(r Reply) bool { return len(r) == 1 && r.Int(0) == 1 })
}

// DrawEntry is one entry of a draw's result as apply_draw.lua takes it.
type DrawEntry struct {
	Won       bool
	Principal string
	Quantity  int
	Token     string
}

// ApplyDraw is apply_draw.lua's ARGV: one batch of a draw's result.
type ApplyDraw struct {
	SKU         string
	Done        int // entries applied before this batch
	HoldMs      int64
	WaitlistMax int
	Nonce       string
	Entries     []DrawEntry
}

// Call builds apply_draw.lua's KEYS and ARGV.
func (a ApplyDraw) Call(k Keys) Call {
	argv := make([]any, 0, 7+4*len(a.Entries))
	argv = append(argv, k.Base(k.PartitionOf(a.SKU)), a.SKU, a.Done, a.HoldMs, a.WaitlistMax, a.Nonce, len(a.Entries))
	for _, en := range a.Entries {
		kind := "L"
		if en.Won {
			kind = "W"
		}
		argv = append(argv, kind, en.Principal, en.Quantity, en.Token)
	}
	return Call{Script: lua.ApplyDraw, Keys: k.applyDrawKeys(a.SKU), Argv: argv}
}

// ApplyDrawReply is apply_draw.lua's {OK, holds, queued, winners not
// held}, {SKIP, done} or {NEEDS_HYDRATION, sku}.
type ApplyDrawReply struct {
	Code                  string
	Holds, Queued, Unheld int
	Done                  int
}

// RunApplyDraw runs apply_draw.lua.
func RunApplyDraw(ctx context.Context, r Runner, k Keys, a ApplyDraw) (ApplyDrawReply, error) {
	return run(ctx, r, a.Call(k), func(r Reply) ApplyDrawReply {
		switch r.Code() {
		case "OK":
			return ApplyDrawReply{Code: "OK", Holds: int(r.Int(1)), Queued: int(r.Int(2)), Unheld: int(r.Int(3))}
		case "SKIP":
			return ApplyDrawReply{Code: "SKIP", Done: int(r.Int(1))}
		}
		return ApplyDrawReply{Code: r.Code()}
	})
}
