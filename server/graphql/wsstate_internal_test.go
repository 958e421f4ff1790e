package graphql

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWSPhaseMoves: a phase moves only along the arrows of wsPhase's
// diagram, so a second close, or a close after the socket closed, is
// refused and changes nothing.
func TestWSPhaseMoves(t *testing.T) {
	t.Parallel()
	allowed := map[[2]wsPhase]bool{
		{wsAwaitingInit, wsOpen}: true, {wsAwaitingInit, wsCloseQueued}: true,
		{wsOpen, wsCloseQueued}: true, {wsCloseQueued, wsCloseWriting}: true,
		{wsCloseWriting, wsCloseSent}: true,
	}
	for from := wsAwaitingInit; from <= wsClosed; from++ {
		for to := wsAwaitingInit; to <= wsClosed; to++ {
			s := wsState{phase: from}
			want := allowed[[2]wsPhase{from, to}] || (to == wsClosed && from != wsClosed)
			require.Equal(t, want, s.to(to), "%s -> %s", from, to)
			if want {
				require.Equal(t, to, s.phase)
			} else {
				require.Equal(t, from, s.phase, "a refused move changed the phase")
			}
		}
	}
	var s wsState
	require.True(t, s.to(wsCloseQueued))
	require.False(t, s.to(wsCloseQueued), "the first close wins")
	require.True(t, s.closing())
}

// TestWSStateDue: what the keep-alive ticker does, phase by phase.
func TestWSStateDue(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	const interval = 10 * time.Second

	t.Run("connection_init within the timeout", func(t *testing.T) {
		s := newWSState(t0.Add(3 * time.Second))
		require.Equal(t, dueNothing, s.due(t0.Add(2*time.Second)))
		require.Equal(t, dueInitTimeout, s.due(t0.Add(3*time.Second)))
		s.open(t0.Add(time.Second), interval, true, time.Time{})
		require.Equal(t, dueNothing, s.due(t0.Add(3*time.Second)), "answered in time")
	})

	t.Run("graphql-ws keep-alives", func(t *testing.T) {
		s := newWSState(t0.Add(time.Second))
		s.open(t0, interval, false, time.Time{})
		require.Equal(t, dueNothing, s.due(t0.Add(interval-time.Millisecond)))
		require.Equal(t, dueKeepAlive, s.due(t0.Add(interval)))
		require.Equal(t, dueNothing, s.due(t0.Add(interval+time.Second)))
		require.Equal(t, dueKeepAlive, s.due(t0.Add(2*interval)))
		require.Equal(t, dueKeepAlive, s.due(t0.Add(10*interval)), "a client that never answers is not dropped")
	})

	t.Run("graphql-transport-ws pings and pongs", func(t *testing.T) {
		s := newWSState(t0.Add(time.Second))
		s.open(t0, interval, true, time.Time{})
		require.Equal(t, duePing, s.due(t0.Add(interval)))
		s.ponged()
		require.Equal(t, duePing, s.due(t0.Add(2*interval)))
		// No pong to the ping at 2 intervals: dead at 4.
		require.Equal(t, duePing, s.due(t0.Add(3*interval)))
		require.Equal(t, dueDead, s.due(t0.Add(4*interval)))
	})

	t.Run("the first pong is due within two intervals", func(t *testing.T) {
		s := newWSState(t0.Add(time.Second))
		s.open(t0, interval, true, time.Time{})
		require.Equal(t, duePing, s.due(t0.Add(interval)))
		require.Equal(t, dueDead, s.due(t0.Add(2*interval)))
	})

	t.Run("the token's expiry", func(t *testing.T) {
		s := newWSState(t0.Add(time.Second))
		s.open(t0, interval, true, t0.Add(interval/2))
		require.Equal(t, dueNothing, s.due(t0.Add(interval/4)))
		require.Equal(t, dueExpired, s.due(t0.Add(interval/2)))
	})

	t.Run("nothing once closing", func(t *testing.T) {
		for _, p := range []wsPhase{wsCloseQueued, wsCloseWriting, wsCloseSent, wsClosed} {
			s := newWSState(t0)
			s.open(t0, interval, true, t0)
			s.phase = p
			require.Equal(t, dueNothing, s.due(t0.Add(time.Hour)), "%s", p)
			s = newWSState(t0)
			s.phase = p
			require.Equal(t, dueNothing, s.due(t0.Add(time.Hour)), "%s, never opened", p)
		}
	})

	t.Run("opening a closing connection", func(t *testing.T) {
		s := newWSState(t0)
		require.True(t, s.to(wsCloseQueued))
		s.open(t0, interval, true, time.Time{})
		require.Equal(t, wsCloseQueued, s.phase)
	})
}
