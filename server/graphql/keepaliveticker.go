package graphql

import (
	"sync"
	"time"
)

// beater is a connection the keep-alive ticker visits.
type beater interface{ beat(now time.Time) }

// keepaliveTicker is the one ticker of every stream connection's timed
// events (a websocket's init timeout, keep-alives, pong deadline and token
// expiry; an SSE stream's keep-alives and token expiry), so ten thousand
// idle connections hold no timer of their own. Each tick it calls every
// connection's beat; it runs while there are connections.
type keepaliveTicker struct {
	tick time.Duration

	mu      sync.Mutex
	conns   map[beater]struct{}
	running bool
	due     []beater
}

func newKeepaliveTicker(l StreamLimits) *keepaliveTicker {
	tick := min(250*time.Millisecond, l.InitTimeout/4, l.PingInterval/4)
	return &keepaliveTicker{tick: max(tick, time.Millisecond), conns: map[beater]struct{}{}}
}

func (k *keepaliveTicker) add(c beater) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.conns[c] = struct{}{}
	if !k.running {
		k.running = true
		go k.run()
	}
}

func (k *keepaliveTicker) remove(c beater) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.conns, c)
}

func (k *keepaliveTicker) run() {
	t := time.NewTicker(k.tick)
	defer t.Stop()
	for now := range t.C {
		k.mu.Lock()
		if len(k.conns) == 0 {
			k.running = false
			k.mu.Unlock()
			return
		}
		due := k.due[:0]
		for c := range k.conns {
			due = append(due, c)
		}
		k.mu.Unlock()
		for _, c := range due {
			c.beat(now)
		}
		clear(due)
		k.due = due
	}
}
