package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// The queue's scripts, each called through one function with its arguments
// and its reply as structs: the positions of KEYS, ARGV and the reply are
// written here once, as each script's header gives them.
type scripts struct {
	restore, join, number, admit *redis.Script
}

func newScripts() scripts {
	return scripts{
		restore: redis.NewScript(lua.MustSource(lua.RestoreQueue)),
		join:    redis.NewScript(lua.MustSource(lua.JoinQueue)),
		number:  redis.NewScript(lua.MustSource(lua.NumberQueue)),
		admit:   redis.NewScript(lua.MustSource(lua.AdmitQueue)),
	}
}

// reply is a script's reply, read by position in this file only; package
// script decodes it, as it does the engine's scripts' replies.
type reply = script.Reply

func run(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, args ...any) (reply, error) {
	v, err := s.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	r, ok := v.([]any)
	if !ok || len(r) == 0 {
		return nil, fmt.Errorf("unexpected script reply %v", v)
	}
	return reply(r), nil
}

// restoreKeys are restore_queue.lua's KEYS.
func (k keys) restoreKeys() []string { return []string{k.queue, k.pre, k.who, k.num, k.pass, k.live} }

// runRestoreChunk writes one chunk of a queue's tickets (restore_queue.lua
// chunk): tickets holds six values per ticket (the script's header). False when
// Redis has the queue (nothing written).
func (s scripts) runRestoreChunk(ctx context.Context, rdb redis.UniversalClient, k keys, first bool, state string, tickets []any) (bool, error) {
	args := make([]any, 0, 3+len(tickets))
	flag := "0"
	if first {
		flag = "1"
	}
	args = append(args, "chunk", flag, state)
	args = append(args, tickets...)
	r, err := run(ctx, rdb, s.restore, k.restoreKeys(), args...)
	if err != nil {
		return false, err
	}
	return r.Str(0) == "OK", nil
}

// publishArgs are restore_queue.lua's publish ARGV.
type publishArgs struct {
	OpensAt                      time.Time
	AdmitPerMinute               int
	PassLife                     time.Duration
	State                        string // pre, numbering, open
	Pre, Next, Numbered, Through int64
}

// runRestorePublish writes the queue's hash (restore_queue.lua publish),
// which makes the queue live: false when Redis had it.
func (s scripts) runRestorePublish(ctx context.Context, rdb redis.UniversalClient, k keys, a publishArgs) (bool, error) {
	r, err := run(ctx, rdb, s.restore, k.restoreKeys(), "publish", a.OpensAt.UnixMilli(), a.AdmitPerMinute,
		a.PassLife.Milliseconds(), a.State, a.Pre, a.Next, a.Numbered, a.Through)
	if err != nil {
		return false, err
	}
	return r.Str(0) == "OK", nil
}

// joinArgs are join_queue.lua's ARGV: a batch of principals of one queue.
type joinArgs struct {
	MaxTickets int
	Principals []string
}

// joinReply is one principal's part of join_queue.lua's reply, with the
// queue's fields the batch shares.
type joinReply struct {
	Code        string // OK, NEEDS_LOAD, QUEUE_FULL, INVALID_INPUT
	Number      int64
	Through     int64
	State       string // pre, numbering, open
	Status      string
	Pass        string
	PassExpires int64 // ms
	PassState   string
	Replayed    bool
}

// runJoin runs join_queue.lua for a batch: one reply per principal, in
// order, or a single NEEDS_LOAD for the whole batch.
func (s scripts) runJoin(ctx context.Context, rdb redis.UniversalClient, k keys, a joinArgs) ([]joinReply, error) {
	args := make([]any, 0, 2+len(a.Principals))
	args = append(args, a.MaxTickets, k.id)
	for _, p := range a.Principals {
		args = append(args, p)
	}
	r, err := run(ctx, rdb, s.join, []string{k.queue, k.pre, k.who, k.num, k.pass, k.outbox}, args...)
	if err != nil {
		return nil, err
	}
	out := make([]joinReply, len(a.Principals))
	switch code := r.Str(0); code {
	case "OK":
	case "NEEDS_LOAD":
		for i := range out {
			out[i].Code = code
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%s answered %q", lua.JoinQueue, code)
	}
	if len(r) != 4+len(a.Principals) {
		return nil, fmt.Errorf("%s answered %d tickets for %d principals", lua.JoinQueue, len(r)-4, len(a.Principals))
	}
	through, state, status := r.Int(1), r.Str(2), r.Str(3)
	for i := range out {
		v, ok := r[4+i].([]any)
		if !ok || len(v) == 0 {
			return nil, fmt.Errorf("%s answered %v for principal %d", lua.JoinQueue, r[4+i], i)
		}
		t := reply(v)
		out[i] = joinReply{Code: t.Str(0), Through: through, State: state, Status: status}
		if out[i].Code == "OK" {
			out[i].Number, out[i].Replayed = t.Int(1), t.Int(2) == 1
			out[i].Pass, out[i].PassExpires, out[i].PassState = t.Str(3), t.Int(4), t.Str(5)
		}
	}
	return out, nil
}

// numberArgs are number_queue.lua's ARGV: principals get First, First+1, ...
type numberArgs struct {
	First      int
	Principals []string
}

// numberReply is number_queue.lua's reply.
type numberReply struct {
	Code          string // OK, NOT_NUMBERING, INVALID_INPUT
	Numbered, Pre int
}

func (s scripts) runNumber(ctx context.Context, rdb redis.UniversalClient, k keys, a numberArgs) (numberReply, error) {
	args := make([]any, 0, 2+len(a.Principals))
	args = append(args, k.id, a.First)
	for _, p := range a.Principals {
		args = append(args, p)
	}
	r, err := run(ctx, rdb, s.number, []string{k.queue, k.who, k.num, k.outbox}, args...)
	if err != nil {
		return numberReply{}, err
	}
	return numberReply{Code: r.Str(0), Numbered: int(r.Int(1)), Pre: int(r.Int(2))}, nil
}

// admitArgs are admit_queue.lua's ARGV (besides the base and the queue).
type admitArgs struct {
	Nonce string
	Most  int
}

// admitReply is admit_queue.lua's reply.
type admitReply struct {
	Code      string // OK, PRE, NUMBER, NEEDS_LOAD, NEEDS_HYDRATION
	Status    Status
	Through   int64
	Next      int64
	Admitted  int
	Unspent   int
	Available int
	Seq       int64
	// Pre and Numbered: NUMBER's; SKU: NEEDS_HYDRATION's.
	Pre, Numbered int
	SKU           string
}

func (s scripts) runAdmit(ctx context.Context, rdb redis.UniversalClient, k keys, r Ref, a admitArgs) (admitReply, error) {
	rep, err := run(ctx, rdb, s.admit, []string{k.queue, k.pre, k.num, k.pass, k.live, k.stock, k.outbox},
		k.base, string(r.Kind), r.ID, a.Nonce, a.Most)
	if err != nil {
		return admitReply{}, err
	}
	out := admitReply{Code: rep.Str(0)}
	switch out.Code {
	case "OK":
		out.Status, out.Through, out.Next = Status(rep.Str(1)), rep.Int(2), rep.Int(3)
		out.Admitted, out.Unspent, out.Available, out.Seq = int(rep.Int(4)), int(rep.Int(5)), int(rep.Int(6)), rep.Int(7)
	case "PRE":
		out.Status, out.Seq = StatusPreQueue, rep.Int(1)
	case "NUMBER":
		out.Status, out.Pre, out.Numbered = StatusPreQueue, int(rep.Int(1)), int(rep.Int(2))
	case "NEEDS_HYDRATION":
		out.SKU = rep.Str(1)
	}
	return out, nil
}
