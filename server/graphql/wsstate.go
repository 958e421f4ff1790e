package graphql

import (
	"slices"
	"time"
)

// wsPhase is where a websocket is in its life. It only moves along the
// arrows, and to wsClosed from any phase:
//
//	wsAwaitingInit --connection_init answered--> wsOpen
//	wsAwaitingInit, wsOpen --close queued--> wsCloseQueued
//	wsCloseQueued --a writer took the close frame--> wsCloseWriting
//	wsCloseWriting --the close frame written--> wsCloseSent
//	any --the socket closed--> wsClosed
//
// A move the arrows do not allow is refused (wsState.to reports false):
// that is how the first close wins, and how nothing is queued once a
// close is.
type wsPhase uint8

const (
	// wsAwaitingInit: upgraded; connection_init is due within InitTimeout.
	wsAwaitingInit wsPhase = iota
	// wsOpen: connection_init answered; operations run, keep-alives go out.
	wsOpen
	// wsCloseQueued: the close frame is queued behind what was queued
	// before it, and nothing more is queued.
	wsCloseQueued
	// wsCloseWriting: a writer took the close frame with the batch it is
	// writing.
	wsCloseWriting
	// wsCloseSent: the close frame is written; the reader waits closeWait
	// for the client's.
	wsCloseSent
	// wsClosed: the socket is closed.
	wsClosed
)

func (p wsPhase) String() string {
	return [...]string{"awaiting init", "open", "close queued", "close writing", "close sent", "closed"}[p]
}

// wsMoves are the arrows: for each phase, the phases it may move to.
var wsMoves = [...][]wsPhase{
	wsAwaitingInit: {wsOpen, wsCloseQueued, wsClosed},
	wsOpen:         {wsCloseQueued, wsClosed},
	wsCloseQueued:  {wsCloseWriting, wsClosed},
	wsCloseWriting: {wsCloseSent, wsClosed},
	wsCloseSent:    {wsClosed},
	wsClosed:       nil,
}

// wsState is a websocket's phase and the times the keep-alive ticker acts
// on. It is guarded by its connection's mutex.
type wsState struct {
	phase        wsPhase
	initDeadline time.Time // wsAwaitingInit: when the wait for connection_init ends
	// wsOpen:
	interval     time.Duration // PingInterval
	pings        bool          // graphql-transport-ws pings; legacy graphql-ws sends keep-alives
	expiresAt    time.Time     // the token's expiry; zero: it has none
	nextBeat     time.Time     // when the next keep-alive or ping is due
	pongDeadline time.Time     // a client that has not answered a ping by then is dead; zero: it answered
}

func newWSState(initDeadline time.Time) wsState {
	return wsState{phase: wsAwaitingInit, initDeadline: initDeadline}
}

// to moves to phase p if an arrow allows it, and reports whether it did.
func (s *wsState) to(p wsPhase) bool {
	if !slices.Contains(wsMoves[s.phase], p) {
		return false
	}
	s.phase = p
	return true
}

// closing reports whether a close frame is queued or gone (or the socket
// closed): nothing more is sent.
func (s *wsState) closing() bool { return s.phase >= wsCloseQueued }

// open moves to wsOpen, connection_init answered at now: keep-alives (or
// pings, when pings) every interval from now, the first pong due within
// two, and the connection's end at expiresAt (zero: none).
func (s *wsState) open(now time.Time, interval time.Duration, pings bool, expiresAt time.Time) {
	if !s.to(wsOpen) {
		return
	}
	s.interval, s.pings, s.expiresAt = interval, pings, expiresAt
	s.nextBeat = now.Add(interval)
	if pings {
		s.pongDeadline = now.Add(2 * interval)
	}
}

// ponged notes the client's pong: the last ping is answered.
func (s *wsState) ponged() { s.pongDeadline = time.Time{} }

// wsDue is what the keep-alive ticker has to do on a connection.
type wsDue uint8

const (
	dueNothing     wsDue = iota
	dueInitTimeout       // close with 1002: no connection_init in time
	dueExpired           // close: the token expired
	dueDead              // close the socket: a ping went unanswered for two intervals
	dueKeepAlive         // send a keep-alive (graphql-ws)
	duePing              // send a ping (graphql-transport-ws)
)

// due says what is due at now, and moves the keep-alive times on as if it
// were done: a ping sent when the last was answered sets the next pong's
// deadline, two intervals on.
func (s *wsState) due(now time.Time) wsDue {
	switch {
	case s.phase == wsAwaitingInit:
		if !now.Before(s.initDeadline) {
			return dueInitTimeout
		}
		return dueNothing
	case s.phase != wsOpen:
		return dueNothing
	case !s.expiresAt.IsZero() && !now.Before(s.expiresAt):
		return dueExpired
	case !s.pongDeadline.IsZero() && !now.Before(s.pongDeadline):
		return dueDead
	case now.Before(s.nextBeat):
		return dueNothing
	}
	s.nextBeat = now.Add(s.interval)
	if !s.pings {
		return dueKeepAlive
	}
	if s.pongDeadline.IsZero() {
		s.pongDeadline = now.Add(2 * s.interval)
	}
	return duePing
}
