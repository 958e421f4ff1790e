package faults

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

type opKind int

const (
	opReserve opKind = iota
	opCommit
	opCancel
	opExpire
)

func (k opKind) String() string {
	return [...]string{"reserve", "commit", "cancel", "expire"}[k]
}

// lzInput and lzOutput are one operation on one SKU as porcupine sees it.
type lzInput struct {
	Kind   opKind
	Client string
	Token  string // commit, cancel, expire
	Qty    int
}

type lzOutput struct {
	Token  string // reserve: the hold
	Status string // commit, cancel: the reservation's status on success
	Code   string // business refusal, "" on success
	ExpMs  int64  // reserve: expiresAt in Unix ms
	RetMs  int64  // when the answer arrived, Unix ms (rounded up)
}

// recorder collects a drop's client operations. A nil recorder records
// nothing, so drops without a history pay nothing.
type recorder struct {
	mu  sync.Mutex
	ops []porcupine.Operation
	ids int
}

type pendingOp struct {
	in   lzInput
	call int64
	id   int
}

func (r *recorder) begin(client string, kind opKind, token string, qty int) *pendingOp {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids++
	return &pendingOp{in: lzInput{Kind: kind, Client: client, Token: token, Qty: qty}, call: time.Now().UnixNano(), id: r.ids}
}

func (r *recorder) end(p *pendingOp, o outcome) {
	if r == nil || p == nil || !o.OK {
		return // undecided operations fail verify; they are not recorded
	}
	ret := time.Now().UnixNano()
	out := lzOutput{Token: o.Token, Status: o.Status, Code: o.Code, RetMs: ret/1e6 + 1}
	if o.Exp != "" {
		if t, err := time.Parse(time.RFC3339Nano, o.Exp); err == nil {
			out.ExpMs = t.UnixMilli()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: p.id, Input: p.in, Call: p.call, Output: out, Return: ret})
}

// tokState is one hold in the model.
type tokState struct {
	Status string
	Qty    int
	ExpMs  int64
}

// skuModel is one SKU: available units and each token's state machine
// HELD -> COMMITTED | CANCELLED | EXPIRED.
type skuModel struct {
	Avail  int
	Tokens map[string]tokState
}

func (m skuModel) with(avail int, tok string, st tokState) skuModel {
	n := skuModel{Avail: avail, Tokens: maps.Clone(m.Tokens)}
	n.Tokens[tok] = st
	return n
}

func stockModel(total int) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return skuModel{Avail: total, Tokens: map[string]tokState{}} },
		Step: func(state, input, output any) (bool, any) {
			m, in, out := state.(skuModel), input.(lzInput), output.(lzOutput)
			switch in.Kind {
			case opReserve:
				switch out.Code {
				case "":
					if _, seen := m.Tokens[out.Token]; seen || m.Avail < in.Qty {
						return false, m
					}
					return true, m.with(m.Avail-in.Qty, out.Token, tokState{Status: "HELD", Qty: in.Qty, ExpMs: out.ExpMs})
				case "OUT_OF_STOCK":
					return m.Avail < in.Qty, m
				}
				return false, m
			case opCommit, opCancel:
				h, ok := m.Tokens[in.Token]
				if !ok {
					return false, m
				}
				pastDue := h.Status == "HELD" && h.ExpMs <= out.RetMs
				switch {
				case out.Code == "" && in.Kind == opCommit && out.Status == "COMMITTED":
					if h.Status == "COMMITTED" {
						return true, m
					}
					if h.Status == "HELD" {
						return true, m.with(m.Avail, in.Token, tokState{Status: "COMMITTED", Qty: h.Qty, ExpMs: h.ExpMs})
					}
				case out.Code == "" && in.Kind == opCancel && out.Status == "CANCELLED":
					if h.Status == "CANCELLED" {
						return true, m
					}
					if h.Status == "HELD" {
						return true, m.with(m.Avail+h.Qty, in.Token, tokState{Status: "CANCELLED", Qty: h.Qty, ExpMs: h.ExpMs})
					}
				case out.Code == "EXPIRED", out.Code == "" && in.Kind == opCancel && out.Status == "EXPIRED":
					// Released by the sweeper or by this very call; the expire
					// operation from the ledger does the release.
					return h.Status == "EXPIRED" || pastDue, m
				case out.Code == "ALREADY_CANCELLED":
					return h.Status == "CANCELLED", m
				case out.Code == "ALREADY_COMMITTED":
					return h.Status == "COMMITTED", m
				}
				return false, m
			case opExpire:
				h, ok := m.Tokens[in.Token]
				if !ok || h.Status != "HELD" {
					return false, m
				}
				return true, m.with(m.Avail+h.Qty, in.Token, tokState{Status: "EXPIRED", Qty: h.Qty, ExpMs: h.ExpMs})
			}
			return false, m
		},
		Equal: func(a, b any) bool {
			x, y := a.(skuModel), b.(skuModel)
			return x.Avail == y.Avail && maps.Equal(x.Tokens, y.Tokens)
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(lzInput), output.(lzOutput)
			return fmt.Sprintf("%s(%s %s q%d) -> %s%s %s", in.Kind, in.Client, in.Token, in.Qty, out.Token, out.Status, out.Code)
		},
		DescribeState: func(state any) string {
			m := state.(skuModel)
			return fmt.Sprintf("avail=%d holds=%d", m.Avail, len(m.Tokens))
		},
	}
}

// history returns the drop's operations plus the sweeper's expiries, read
// from the ledger once the write-behind has drained (verify has waited for
// it). An expiry happened within the millisecond Redis stamped it with.
func (d *drop) history(t *testing.T) []porcupine.Operation {
	t.Helper()
	d.rec.mu.Lock()
	ops := append([]porcupine.Operation(nil), d.rec.ops...)
	d.rec.mu.Unlock()
	rows, err := d.s.Pool.Query(context.Background(),
		`SELECT token, quantity, occurred_at FROM stock_movements WHERE sku = $1 AND kind = 'expire'`, d.cfg.SKU)
	require.NoError(t, err)
	defer rows.Close()
	id := 1 << 30
	for rows.Next() {
		var tok string
		var qty int
		var at time.Time
		require.NoError(t, rows.Scan(&tok, &qty, &at))
		id++
		ms := at.UnixMilli()
		ops = append(ops, porcupine.Operation{ClientId: id, Input: lzInput{Kind: opExpire, Client: "sweeper", Token: tok, Qty: qty},
			Call: (ms - 1) * 1e6, Output: lzOutput{}, Return: (ms + 2) * 1e6})
	}
	require.NoError(t, rows.Err())
	return ops
}

// Per-SKU histories of reserve / commit / cancel / expire from concurrent
// drops with faults that keep Redis' data (lost replies, SCRIPT FLUSH, a
// SIGKILLed instance) are linearizable against a one-SKU model: a stock
// counter and a state machine per token.
func TestLinearizableUnderFaults(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	rp := testenv.NewProxy(t, s.Redis.Addr)
	s.RedisVia = rp.Addr
	a := s.start("a")
	s.start("b")
	rp.LoseReplies(20)

	rounds := scale(3, 10)
	var ops, faults int
	for round := 0; round < rounds; round++ {
		d := startDrop(s, dropConfig{
			SKU: fmt.Sprintf("LIN-%d", round), Total: 12, Buyers: 36, Concurrency: 10, MaxQty: 2, HoldSeconds: 1,
			Commit: 0.4, Cancel: 0.3, DoubleCommit: 0.3, Pace: 25 * time.Millisecond, Record: true,
		})
		stopFlush := make(chan struct{})
		flushed := make(chan int)
		go func() {
			n := 0
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stopFlush:
					flushed <- n
					return
				case <-tick.C:
					if s.RDB.ScriptFlush(context.Background()).Err() == nil {
						n++
					}
				}
			}
		}()
		if round == 1 {
			d.waitProgress(t, 12)
			a.kill(t)
			faults++
		}
		d.wait(t)
		close(stopFlush)
		faults += <-flushed
		d.verify(t, verifyOpts{})
		h := d.history(t)
		ops += len(h)
		res, info := porcupine.CheckOperationsVerbose(stockModel(12), h, 20*time.Second)
		if res != porcupine.Ok {
			path := fmt.Sprintf("%s/lin-%d.html", t.TempDir(), round)
			_ = porcupine.VisualizePath(stockModel(12), info, path)
			t.Fatalf("round %d: history of %d operations is %s (visualization: %s)", round, len(h), res, path)
		}
		if round == 1 {
			s.start("a2")
		}
	}
	t.Logf("FIGURES linearizability: rounds=%d operations=%d faults=%d (script flushes, one SIGKILL) lost_replies=%d violations=0",
		rounds, ops, faults, rp.Dropped.Load())
}
