package cart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// AbandonStaleCarts is the cart sweep: it lets go of carts left PENDING more
// than a moment past their deadline in any partition, because the call that
// opened them died or stalled before it finished, and of the lines of HELD
// carts past their expiry. Each such cart is marked ABANDONED
// (abandon_cart.lua: from then on its caller can no longer record it as
// held), then every line it named is released, then it leaves the pending
// index. By its deadline no line of it can be held or confirmed any more, so
// the lines it names are all it will ever have. Every step is idempotent, so
// any number of processes may sweep at once, with no lease: a process that
// dies mid-sweep leaves the cart in the index for the next.
//
// The sweep is batched: the carts due are marked in one pipelined round
// trip, then all their lines are released in pipelined chunks (each line
// its own run of release_hold.lua, as a cancel), then the carts leave the
// index in one more; 600 carts of 50 lines cost about 62 round trips, not
// 30,600 one after the other. It takes at most limit carts per partition
// and returns how many carts it let go.
func (a Carts) AbandonStaleCarts(ctx context.Context, limit int) (int, error) {
	n, _, err := a.SweepCarts(ctx, limit, limit*script.Partitions)
	return n, err
}

// SweepCarts is AbandonStaleCarts for at most carts carts in all (the
// oldest-listed of each partition first, up to perPartition each), so one
// call's work, and so its time, stays bounded however many carts fall due
// together; more says it left due carts for another call.
func (a Carts) SweepCarts(ctx context.Context, perPartition, carts int) (n int, more bool, err error) {
	e := a.e
	limit := perPartition
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return 0, false, core.Unavailable("reading Redis time", err)
	}
	cutoff := strconv.FormatInt(now.Add(-cartSweepMargin).UnixMilli(), 10)
	cmds := make([]*redis.StringSliceCmd, script.Partitions)
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for pt := range script.Partitions {
			cmds[pt] = pipe.ZRangeByScore(ctx, e.keys.CartsPending(pt), &redis.ZRangeBy{Min: "-inf", Max: cutoff, Count: int64(limit)})
		}
		return nil
	})
	if err != nil {
		return 0, false, core.Unavailable("listing stale carts", err)
	}
	type staleCart struct {
		home          int
		token, who    string
		expired, busy bool
		err           error
		lines         []cartLine
	}
	var stale []*staleCart
	var marks []script.Call
	for pt, c := range cmds {
		more = more || len(c.Val()) == limit
		for _, tok := range c.Val() {
			if len(stale) == carts {
				more = true
				break
			}
			stale = append(stale, &staleCart{home: pt, token: tok})
			marks = append(marks, script.AbandonCart{Home: pt, Token: tok}.Call(e.keys))
		}
	}
	if len(stale) == 0 {
		return 0, false, nil
	}

	// 1. Every cart marked ABANDONED (or found HELD past its expiry).
	replies, errs := e.core.RunMany(ctx, lua.AbandonCart, marks)
	var releases []script.Call
	var owners []*staleCart
	for i, c := range stale {
		if errs[i] != nil {
			c.err = fmt.Errorf("abandoning cart %s: %w", c.token, errs[i])
			continue
		}
		ab := script.AbandonCartReplyOf(replies[i])
		if core.ReplyCode(ab.Code) != core.CodeOK && core.ReplyCode(ab.Code) != core.ReplyOf(outcome.ErrExpired) {
			c.busy = true // finished meanwhile, or not due: nothing to let go, and it is not ours to unlist
			continue
		}
		c.expired = core.ReplyCode(ab.Code) == core.ReplyOf(outcome.ErrExpired)
		var enc string
		c.who, enc = ab.Who, ab.Lines
		if err := json.Unmarshal([]byte(enc), &c.lines); err != nil {
			c.err = fmt.Errorf("abandoning cart %s: %w", c.token, err)
			continue
		}
		for _, l := range c.lines {
			pt := e.keys.PartitionOf(l.SKU)
			releases = append(releases, e.holds.ReleaseArgs(pt, l.Token, core.Principal{ID: c.who}, string(core.StatusCancelled)).Call(e.keys))
			owners = append(owners, c)
		}
	}

	// 2. Every line of every cart released, as a cancel by its owner.
	replies, errs = e.core.RunMany(ctx, lua.ReleaseHold, releases)
	for i, c := range owners {
		r := script.HoldOf(replies[i])
		switch {
		case errs[i] != nil:
			if c.err == nil {
				c.err = fmt.Errorf("abandoning cart %s: %w", c.token, errs[i])
			}
		case core.ReplyCode(r.Code) == core.CodeCommitInProgress:
			c.busy = true // the commit settles it; look again next time
		case core.ReplyCode(r.Code) == core.CodeOK && !r.Replayed && c.expired && r.Exp > r.End:
			// Released before its own expiry: a line the cart's expiry
			// outlived (one already due is the hold sweeper's work, done
			// here first).
			e.log.Warn().Str("cart", c.token).Str("sku", r.SKU).
				Msg("let go of a cart line still held past its cart's expiry (an extension of the cart was interrupted)")
		}
	}

	// 3. The carts let go leave the index; the others stay for the next sweep.
	abandoned := 0
	var failures []error
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range stale {
			if c.err != nil {
				failures = append(failures, c.err)
				continue
			}
			if c.busy {
				continue
			}
			pipe.ZRem(ctx, e.keys.CartsPending(c.home), c.token)
			if !c.expired {
				abandoned++
				e.log.Warn().Str("cart", c.token).Int("lines", len(c.lines)).Msg("let go of a cart its caller left unfinished past its deadline")
			}
		}
		return nil
	})
	if err != nil {
		failures = append(failures, core.Unavailable("abandoning carts", err))
		abandoned = 0
	}
	return abandoned, more, errors.Join(failures...)
}
