package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// holdingRun is a Run whose batches each wait for a release; it keeps the
// batches' requests and the most batches on their way at once.
type holdingRun struct {
	mu        sync.Mutex
	batches   [][]int
	onWay     int
	mostOnWay int
	arrived   chan int
	release   chan struct{}
}

func newHoldingRun() *holdingRun {
	return &holdingRun{arrived: make(chan int, 1024), release: make(chan struct{}, 1024)}
}

func (h *holdingRun) run(_ context.Context, k string, calls []*Call[int, string]) {
	reqs := make([]int, len(calls))
	for i, c := range calls {
		reqs[i] = c.Req
	}
	h.mu.Lock()
	h.batches = append(h.batches, reqs)
	h.onWay++
	h.mostOnWay = max(h.mostOnWay, h.onWay)
	h.mu.Unlock()
	h.arrived <- len(calls)
	<-h.release
	h.mu.Lock()
	h.onWay--
	h.mu.Unlock()
	for _, c := range calls {
		c.Answer(fmt.Sprintf("%s/%d", k, c.Req), nil)
	}
}

func (h *holdingRun) next(t *testing.T) int {
	t.Helper()
	select {
	case n := <-h.arrived:
		return n
	case <-time.After(30 * time.Second):
		t.Fatal("no batch started")
		return 0
	}
}

// doMany sends requests from..to-1 of k at once and returns the channel
// their errors come on, each answer checked against its request.
func doMany(ctx context.Context, b *Batcher[string, int, string], k string, from, to int) <-chan error {
	errs := make(chan error, to-from)
	for i := from; i < to; i++ {
		go func() {
			res, err := b.Do(ctx, k, i)
			if want := fmt.Sprintf("%s/%d", k, i); err == nil && res != want {
				err = fmt.Errorf("request %d was answered %q, want %q", i, res, want)
			}
			errs <- err
		}()
	}
	return errs
}

func waitAll(t *testing.T, errs <-chan error, n int) {
	t.Helper()
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request was never answered")
		}
	}
}

func waitWaiting[K comparable, Req, Res any](t *testing.T, b *Batcher[K, Req, Res], k K, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if got, _ := b.Waiting(k); got >= n {
			return
		}
	}
	t.Fatalf("fewer than %d requests ever waited", n)
}

// The requests that come while InFlight batches are on their way wait, and
// go in batches of at most Max; each caller gets its own answer, and a
// key's batches do not hold up another key's.
func TestBatcherBoundsBatchesOnTheirWay(t *testing.T) {
	h := newHoldingRun()
	b := New(Options{Max: 4, InFlight: 2}, h.run)
	ctx := context.Background()
	first := doMany(ctx, b, "a", 0, 1)
	h.next(t)
	second := doMany(ctx, b, "a", 1, 2)
	h.next(t)
	more := doMany(ctx, b, "a", 2, 12)
	waitWaiting(t, b, "a", 10)
	other := doMany(ctx, b, "b", 0, 1)
	if n := h.next(t); n != 1 {
		t.Fatalf("key b's lone request went in a batch of %d", n)
	}
	for range 2 + 1 + 3 { // 10 waiting: batches of 4, 4, 2
		h.release <- struct{}{}
	}
	waitAll(t, first, 1)
	waitAll(t, second, 1)
	waitAll(t, more, 10)
	waitAll(t, other, 1)
	seen := map[int]int{}
	for _, batch := range h.batches {
		if len(batch) > 4 {
			t.Fatalf("a batch of %d requests, want at most 4", len(batch))
		}
		for _, r := range batch {
			seen[r]++
		}
	}
	if len(seen) != 12 || h.mostOnWay > 3 {
		t.Fatalf("batches %v (%d on their way at most); want each of 12 requests, at most 3", h.batches, h.mostOnWay)
	}
	waitIdle(t, b, func(b *Batcher[string, int, string]) bool {
		return b.queues["a"].inFlight == 0 && b.queues["b"].inFlight == 0
	})
}

// waitIdle waits until idle(b) holds, with b.mu held.
func waitIdle(t *testing.T, b *Batcher[string, int, string], idle func(*Batcher[string, int, string]) bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.mu.Lock()
		ok := idle(b)
		b.mu.Unlock()
		if ok {
			return
		}
	}
	t.Fatal("the batcher never went idle")
}

// A caller that stops waiting before its batch leaves is not sent, and is
// told so; an idle key is forgotten when Forget says so.
func TestBatcherLeavesOutCallersThatLeft(t *testing.T) {
	h := newHoldingRun()
	errNotSent := errors.New("not sent")
	b := New(Options{Max: 4, InFlight: 1, Forget: true, NotSent: func(err error) error { return errors.Join(errNotSent, err) }}, h.run)
	first := doMany(context.Background(), b, "a", 0, 1)
	h.next(t)
	ctx, cancel := context.WithCancel(context.Background())
	gone := doMany(ctx, b, "a", 1, 2)
	stays := doMany(context.Background(), b, "a", 2, 3)
	waitWaiting(t, b, "a", 2)
	cancel()
	if err := <-gone; !errors.Is(err, errNotSent) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v, want it not sent", err)
	}
	h.release <- struct{}{}
	if n := h.next(t); n != 1 {
		t.Fatalf("the batch after the first had %d requests, want the one still waited for", n)
	}
	h.release <- struct{}{}
	waitAll(t, first, 1)
	waitAll(t, stays, 1)
	if _, err := b.Do(ctx, "a", 9); !errors.Is(err, errNotSent) {
		t.Fatalf("a request whose caller had already left got %v, want it not sent", err)
	}
	waitIdle(t, b, func(b *Batcher[string, int, string]) bool { return len(b.queues) == 0 })
}
