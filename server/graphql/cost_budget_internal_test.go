package graphql

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A budget holds burst points, is spent before an operation runs, gets
// back what the operation did not use, refills at rate, and is forgotten
// once full; an operation it cannot pay for is refused whole and told when
// it could be.
func TestCostBudgets(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	b := newCostBudgets(100, 1000, func() time.Time { return now })

	ok, st := b.spend(key("a"), 600)
	require.True(t, ok)
	require.InDelta(t, 400, st.Available, 1e-9)
	require.Equal(t, 6*time.Second, st.UntilFull)

	ok, st = b.spend(key("a"), 500)
	require.False(t, ok, "400 left")
	require.InDelta(t, 400, st.Available, 1e-9, "a refusal takes nothing")
	require.Equal(t, time.Second, st.RetryAfter, "100 more points, at 100 a second")

	st = b.refund(key("a"), 550) // it cost 50
	require.InDelta(t, 950, st.Available, 1e-9)
	require.InDelta(t, 1000, b.peek(key("b")).Available, 1e-9, "each key its own budget")

	now = now.Add(250 * time.Millisecond)
	require.InDelta(t, 975, b.peek(key("a")).Available, 1e-6)
	st = b.refund(key("a"), 10_000)
	require.InDelta(t, 1000, st.Available, 1e-9, "never past full")
	require.Zero(t, st.UntilFull)
	require.Empty(t, b.full, "a full budget is not kept")

	// Budgets that filled up again are swept, once per time it takes to
	// fill one.
	for _, k := range []string{"c", "d", "e"} {
		ok, _ := b.spend(key(k), 100)
		require.True(t, ok)
	}
	require.Len(t, b.full, 3)
	now = now.Add(11 * time.Second)
	ok, _ = b.spend(key("f"), 1)
	require.True(t, ok)
	require.Len(t, b.full, 1, "only f is not full")
}

func key(principal string) budgetKey { return budgetKey{principal: principal} }

// Concurrent spends never take more than the budget holds.
func TestCostBudgetsConcurrentSpends(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	b := newCostBudgets(1, 1000, func() time.Time { return now })
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, _ := b.spend(key("k"), 3); ok {
				mu.Lock()
				won++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 333, won)
}
