package draw

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dropline/dropline/db"
)

// fakeLedger records batches for the batcher's tests: each batch waits
// for a release before it commits, and the sizes and the most batches on
// their way at once are kept.
type fakeLedger struct {
	mu        sync.Mutex
	sizes     []int
	onWay     int
	mostOnWay int
	arrived   chan int      // each batch's size as it starts
	release   chan struct{} // one per batch to commit
}

func (f *fakeLedger) record(ctx context.Context, reqs []db.DrawEntryRequest) ([]db.DrawEntryAnswer, error) {
	f.mu.Lock()
	f.sizes = append(f.sizes, len(reqs))
	f.onWay++
	f.mostOnWay = max(f.mostOnWay, f.onWay)
	f.mu.Unlock()
	f.arrived <- len(reqs)
	<-f.release
	f.mu.Lock()
	f.onWay--
	f.mu.Unlock()
	out := make([]db.DrawEntryAnswer, len(reqs))
	for i, r := range reqs {
		out[i].Entry = db.DrawEntry{SKU: r.SKU, Principal: r.Principal, Quantity: r.Quantity}
	}
	return out, nil
}

func newBatchEngine(t *testing.T, gatherWait time.Duration) (*engine, *fakeLedger) {
	t.Helper()
	f := &fakeLedger{arrived: make(chan int, 1024), release: make(chan struct{}, 1024)}
	e := &engine{metrics: NewMetrics(nil)}
	e.entries = e.newEntryBatcher(f.record, gatherWait)
	return e, f
}

// enterMany enters n principals (named from first) at once and returns
// the channel their answers' errors come on, each checked against its
// request.
func enterMany(e *engine, first, n int) <-chan error {
	errs := make(chan error, n)
	for i := first; i < first+n; i++ {
		go func() {
			who := fmt.Sprintf("p%d", i)
			ans, err := e.enterInBatch(context.Background(), db.DrawEntryRequest{SKU: "DRAW-X", Principal: who, Quantity: 1})
			if err == nil && ans.Entry.Principal != who {
				err = fmt.Errorf("%s was answered %s's entry", who, ans.Entry.Principal)
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
			t.Fatal("an entry was never answered")
		}
	}
}

// waitPending waits until n entries wait for a batch.
func waitPending(t *testing.T, e *engine, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if got, _ := e.entries.Waiting(struct{}{}); got >= n {
			return
		}
	}
	t.Fatalf("fewer than %d entries ever waited", n)
}

func nextBatch(t *testing.T, f *fakeLedger) int {
	t.Helper()
	select {
	case n := <-f.arrived:
		return n
	case <-time.After(30 * time.Second):
		t.Fatal("no batch started")
		return 0
	}
}

// afterALoneBatch enters one principal, whose batch goes at once, then n
// more (from p1), which wait for it, and lets the lone batch commit: the
// batch that comes back finds the n waiting. It returns the channel of the
// n entries' errors.
func afterALoneBatch(t *testing.T, e *engine, f *fakeLedger, n int) <-chan error {
	t.Helper()
	first := enterMany(e, 0, 1)
	if got := nextBatch(t, f); got != 1 {
		t.Fatalf("the lone entry went in a batch of %d", got)
	}
	more := enterMany(e, 1, n)
	waitPending(t, e, n)
	f.release <- struct{}{}
	waitAll(t, first, 1)
	return more
}

// A lone entry goes at once, in a batch of its own; the entries that come
// while it commits go together in the next, one batch on its way at a
// time.
func TestEntryBatcherGathersWhileABatchCommits(t *testing.T) {
	e, f := newBatchEngine(t, time.Hour)
	more := afterALoneBatch(t, e, f, 100)
	if n := nextBatch(t, f); n != 100 {
		t.Fatalf("the 100 entries that came meanwhile went in a batch of %d", n)
	}
	f.release <- struct{}{}
	waitAll(t, more, 100)
	if f.mostOnWay != 1 {
		t.Fatalf("%d batches were on their way at once, want 1", f.mostOnWay)
	}
}

// A batch that comes back to a few entries waiting waits for
// entryGatherFew before it leaves (here for as long as it takes).
func TestEntryBatcherGathersAFewMoreWhenBusy(t *testing.T) {
	e, f := newBatchEngine(t, time.Hour)
	few := afterALoneBatch(t, e, f, 3)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, gathering := e.entries.Waiting(struct{}{}); gathering {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch did not wait for more")
		}
	}
	rest := enterMany(e, 4, entryGatherFew-3)
	if n := nextBatch(t, f); n != entryGatherFew {
		t.Fatalf("the gathered batch had %d entries, want %d", n, entryGatherFew)
	}
	f.release <- struct{}{}
	waitAll(t, few, 3)
	waitAll(t, rest, entryGatherFew-3)
}

// A gathering batch leaves after entryGatherWait with what it has.
func TestEntryBatcherGathersNoLongerThanItsWait(t *testing.T) {
	e, f := newBatchEngine(t, time.Millisecond)
	few := afterALoneBatch(t, e, f, 3)
	if n := nextBatch(t, f); n != 3 {
		t.Fatalf("the batch had %d entries, want the 3 waiting", n)
	}
	f.release <- struct{}{}
	waitAll(t, few, 3)
}

// More than a whole batch waiting besides the one on its way starts a
// second, never a third.
func TestEntryBatcherSecondBatchForAFullOne(t *testing.T) {
	e, f := newBatchEngine(t, time.Hour)
	first := enterMany(e, 0, 1)
	nextBatch(t, f)
	many := enterMany(e, 1, 3*maxEntryBatch)
	if n := nextBatch(t, f); n != maxEntryBatch {
		t.Fatalf("the second batch had %d entries, want %d", n, maxEntryBatch)
	}
	waitPending(t, e, 2*maxEntryBatch) // every entry has come: the rest is two whole batches
	for range 4 {
		f.release <- struct{}{}
	}
	waitAll(t, first, 1)
	waitAll(t, many, 3*maxEntryBatch)
	total := 0
	for _, n := range f.sizes {
		total += n
	}
	if total != 1+3*maxEntryBatch || f.mostOnWay != entryBatchesInFlight {
		t.Fatalf("batches %v (%d entries), at most %d on their way; want %d entries, %d", f.sizes, total, f.mostOnWay, 1+3*maxEntryBatch, entryBatchesInFlight)
	}
}
