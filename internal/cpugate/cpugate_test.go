package cpugate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/cpugate"
)

// waitFor waits until n requests wait at g.
func waitFor(t *testing.T, g *cpugate.Gate, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return g.Waiting() == n }, 5*time.Second, time.Millisecond)
}

// TestFreshInOrder: with the gate full, new requests get their slots in
// the order they came, one as each slot is given back.
func TestFreshInOrder(t *testing.T) {
	g := cpugate.New(1)
	first := g.NewTicket()
	_, err := first.Acquire(context.Background(), 0)
	require.NoError(t, err)
	const n = 5
	order := make(chan int, n)
	tickets := make([]*cpugate.Ticket, n)
	for i := range n {
		tickets[i] = g.NewTicket()
		go func() {
			waited, err := tickets[i].Acquire(context.Background(), 0)
			if err != nil || !waited {
				order <- -1
				return
			}
			order <- i
		}()
		waitFor(t, g, i+1)
	}
	first.Leave()
	for i := range n {
		require.Equal(t, i, <-order)
		require.Equal(t, 1, g.InUse())
		tickets[i].Leave()
	}
	require.Zero(t, g.InUse())
	require.Zero(t, g.Waiting())
}

// TestPauseGivesTheSlotBack: a request waiting on the network holds no
// slot, and when its wait ends it takes one again ahead of requests that
// have not started.
func TestPauseGivesTheSlotBack(t *testing.T) {
	g := cpugate.New(1)
	a := g.NewTicket()
	_, err := a.Acquire(context.Background(), 0)
	require.NoError(t, err)
	ctx := cpugate.WithTicket(context.Background(), a)

	resume := cpugate.Pause(ctx)
	require.False(t, a.Held())
	b := g.NewTicket()
	waited, err := b.Acquire(context.Background(), 0)
	require.NoError(t, err)
	require.False(t, waited, "the paused request's slot is free")

	// a comes back while b runs and c waits to start: a goes first.
	c := g.NewTicket()
	cGot := make(chan struct{})
	go func() {
		_, _ = c.Acquire(context.Background(), 0)
		close(cGot)
	}()
	waitFor(t, g, 1)
	aBack := make(chan struct{})
	go func() {
		resume()
		close(aBack)
	}()
	waitFor(t, g, 2)
	b.Leave()
	<-aBack
	require.True(t, a.Held())
	select {
	case <-cGot:
		t.Fatal("a new request was served before one coming back")
	default:
	}
	a.Leave()
	<-cGot
	require.True(t, c.Held())
	c.Leave()
	require.Zero(t, g.InUse())
}

// TestNestedPauses: concurrent waits of one request give one slot back and
// take one again when the last ends; an exempt request takes none.
func TestNestedPauses(t *testing.T) {
	g := cpugate.New(2)
	a := g.NewTicket()
	_, err := a.Acquire(context.Background(), 0)
	require.NoError(t, err)
	ctx := cpugate.WithTicket(context.Background(), a)
	r1, r2 := cpugate.Pause(ctx), cpugate.Pause(ctx)
	require.Zero(t, g.InUse())
	r1()
	require.Zero(t, g.InUse())
	r2()
	require.Equal(t, 1, g.InUse())
	a.Exempt()
	require.Zero(t, g.InUse())
	cpugate.Pause(ctx)()
	require.Zero(t, g.InUse(), "an exempt request takes no slot")
	cpugate.Pause(cpugate.Detach(ctx))()
	cpugate.Pause(context.Background())()
	a.Leave()
	require.Zero(t, g.InUse())
}

// TestGivingUp: a wait that times out, or whose request leaves, takes no
// slot and leaves none taken.
func TestGivingUp(t *testing.T) {
	g := cpugate.New(1)
	a := g.NewTicket()
	_, err := a.Acquire(context.Background(), 0)
	require.NoError(t, err)

	b := g.NewTicket()
	_, err = b.Acquire(context.Background(), 20*time.Millisecond)
	require.True(t, errors.Is(err, cpugate.ErrTimeout), "%v", err)
	require.False(t, b.Held())

	ctx, cancel := context.WithCancel(context.Background())
	c := g.NewTicket()
	done := make(chan error)
	go func() {
		_, err := c.Acquire(ctx, 0)
		done <- err
	}()
	waitFor(t, g, 1)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Zero(t, g.Waiting())
	require.Equal(t, 1, g.InUse())
	a.Leave()
	require.Zero(t, g.InUse())
	d := g.NewTicket()
	waited, err := d.Acquire(context.Background(), 0)
	require.NoError(t, err)
	require.False(t, waited)
	d.Leave()
}
