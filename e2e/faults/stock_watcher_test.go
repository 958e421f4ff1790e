package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
)

// stockWatcher follows one stockChanged subscription, keeping the newest
// value and when it arrived.
type stockWatcher struct {
	changed chan struct{} // a value arrived (capacity 1)
	ended   chan struct{} // the subscription's stream ended

	mu   sync.Mutex
	last stock
	at   time.Time
	bad  []string
}

func watchStock(sub *wsclient.Subscription) *stockWatcher {
	w := &stockWatcher{changed: make(chan struct{}, 1), ended: make(chan struct{})}
	go func() {
		defer close(w.ended)
		for m := range sub.C {
			var out struct {
				StockChanged stock `json:"stockChanged"`
			}
			w.mu.Lock()
			switch {
			case len(m.Errors) > 0:
				w.bad = append(w.bad, fmt.Sprintf("errors: %+v", m.Errors))
			case json.Unmarshal(m.Data, &out) != nil:
				w.bad = append(w.bad, fmt.Sprintf("undecodable: %s", m.Data))
			default:
				w.last, w.at = out.StockChanged, m.At
			}
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// waitFor waits until the newest value is want and returns when it arrived.
func (w *stockWatcher) waitFor(want stock, within time.Duration) (time.Time, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		w.mu.Lock()
		last, at := w.last, w.at
		w.mu.Unlock()
		if last == want {
			return at, nil
		}
		select {
		case <-w.changed:
		case <-w.ended:
			w.mu.Lock()
			last, at = w.last, w.at
			w.mu.Unlock()
			if last == want {
				return at, nil
			}
			return time.Time{}, fmt.Errorf("the subscription ended at %+v, want %+v", last, want)
		case <-timer.C:
			return time.Time{}, fmt.Errorf("the newest value after %s is %+v, want %+v", within, last, want)
		}
	}
}

func (w *stockWatcher) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bad)
}

// stockStepper changes one SKU's stock a unit at a time over GraphQL HTTP:
// it reserves until depth units are held, cancels them one by one, and
// again, so the stock after each step is known and differs from the one
// before. Each reserve comes from a fresh principal, so the mutation rate
// limit never answers in its place.
type stockStepper struct {
	s     *system
	p     *proc
	sku   string
	depth int
	want  stock
	held  [][2]string // reservation token, owner's bearer token
	down  bool
	steps int
}

func newStockStepper(s *system, p *proc, sku string, initial stock, depth int) *stockStepper {
	return &stockStepper{s: s, p: p, sku: sku, depth: depth, want: initial}
}

// step makes one change and returns the stock it leads to and when its
// mutation answered.
func (st *stockStepper) step(ctx context.Context, t *testing.T) (stock, time.Time) {
	t.Helper()
	if len(st.held) == st.depth {
		st.down = true
	} else if len(st.held) == 0 {
		st.down = false
	}
	st.steps++
	if st.down {
		h := st.held[0]
		st.held = st.held[1:]
		st.cancel(ctx, t, h)
		return st.want, time.Now()
	}
	owner := st.s.token(fmt.Sprintf("ws-stepper-%d", st.steps), false)
	r := post(ctx, quickClient, st.p.URL, owner, reserveMutation, map[string]any{"input": map[string]any{"sku": st.sku, "quantity": 1}})
	answered := time.Now()
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status)
	require.Empty(t, r.Errors)
	var out struct {
		Reserve struct {
			Reservation *struct {
				Token string `json:"token"`
			} `json:"reservation"`
			UserErrors []userError `json:"userErrors"`
		} `json:"reserve"`
	}
	require.NoError(t, json.Unmarshal(r.Data, &out))
	require.Empty(t, out.Reserve.UserErrors)
	require.NotNil(t, out.Reserve.Reservation)
	st.held = append(st.held, [2]string{out.Reserve.Reservation.Token, owner})
	st.want.Available--
	st.want.Held++
	return st.want, answered
}

func (st *stockStepper) cancel(ctx context.Context, t *testing.T, h [2]string) {
	t.Helper()
	r := post(ctx, quickClient, st.p.URL, h[1], cancelMutation, map[string]any{"token": h[0]})
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status)
	require.Empty(t, r.Errors)
	require.NotContains(t, string(r.Data), `"code"`, "cancel refused: %s", r.Data)
	st.want.Available++
	st.want.Held--
}

// release cancels every hold the stepper still has.
func (st *stockStepper) release(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, h := range st.held {
		st.cancel(ctx, t, h)
	}
	st.held = nil
}

// latencies are the delays between a change's answer and a subscriber's
// value; a value that arrived before the answer counts as zero.
type latencies []time.Duration

func (l *latencies) add(d time.Duration) { *l = append(*l, max(d, 0)) }

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return slices.Max(l)
}

func (l latencies) String() string {
	if len(l) == 0 {
		return "n=0"
	}
	s := slices.Sorted(slices.Values(l))
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(s), s[len(s)/2].Round(time.Millisecond),
		s[min(len(s)-1, len(s)*99/100)].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
