package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/resolvers"
)

// Shared subscriptions: during a drop thousands of browsers send the same
// stockChanged (or queueChanged) document with the same variables, and what
// they may see of a Stock (a Queue) does not depend on who they are (the
// field is public and the type has no per-caller field). Such subscriptions form a group: the document
// is executed once per update, by gqlgen's own executor (so the result is
// byte for byte what gqlgen answers for that document), and every member
// is handed the same response. A member holds no goroutine, channel or
// buffer of its own beyond what the transport has: only the version of
// each SKU's value it last took. The group keeps the newest response per
// SKU and a broadcast channel that is closed and replaced on every update;
// a member that is not ready (its client reads slowly) simply takes the
// newest value when it is, so a stalled reader costs one bounded mailbox,
// and the transport's write timeout disconnects it as before.
//
// The key is (visibility, operation name, document, variables after
// coercion). Anything else — another root field, a query or mutation over
// a websocket — goes to the executor as before.

// shareable names the subscription root fields whose result depends only on
// the document and its variables, never on the caller.
var shareable = map[string]bool{"stockChanged": true, "queueChanged": true}

// sharingTransport runs a gqlgen transport with an executor that groups
// identical shareable subscriptions.
type sharingTransport struct {
	inner  gqlgen.Transport
	groups *subscriptionGroups
}

func (t sharingTransport) Supports(r *http.Request) bool { return t.inner.Supports(r) }

func (t sharingTransport) Do(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor) {
	t.inner.Do(w, r, sharingExecutor{GraphExecutor: exec, groups: t.groups})
}

type sharingExecutor struct {
	gqlgen.GraphExecutor
	groups *subscriptionGroups
}

func (e sharingExecutor) DispatchOperation(ctx context.Context, rc *gqlgen.OperationContext) (gqlgen.ResponseHandler, context.Context) {
	key, field, ok := shareKey(rc)
	if !ok {
		return e.GraphExecutor.DispatchOperation(ctx, rc)
	}
	release := func() {}
	if st := resolvers.StreamFrom(ctx); st != nil {
		r, ok := st.AdmitOperation()
		if !ok {
			// The resolver refuses it too, in its own words.
			return e.GraphExecutor.DispatchOperation(ctx, rc)
		}
		release = r
	}
	m := e.groups.join(key, field, rc, e.GraphExecutor)
	m.release = release
	return m.next, ctx
}

// shareKey returns the group key of a shareable subscription.
func shareKey(rc *gqlgen.OperationContext) (key, field string, ok bool) {
	if rc == nil || rc.Operation == nil || rc.Operation.Operation != ast.Subscription {
		return "", "", false
	}
	fields := gqlgen.CollectFields(rc, rc.Operation.SelectionSet, []string{"Subscription"})
	if len(fields) != 1 || !shareable[fields[0].Name] {
		return "", "", false
	}
	vars, err := json.Marshal(rc.Variables) // map keys sorted: one spelling per value
	if err != nil {
		return "", "", false
	}
	return "public\x00" + rc.OperationName + "\x00" + rc.RawQuery + "\x00" + string(vars), fields[0].Name, true
}

// subscriptionGroups holds the live groups by key.
type subscriptionGroups struct {
	res *resolvers.Resolver
	m   *sharedMetrics

	mu     sync.Mutex
	groups map[string]*subscriptionGroup
}

func newSubscriptionGroups(res *resolvers.Resolver, reg prometheus.Registerer) *subscriptionGroups {
	return &subscriptionGroups{res: res, m: newSharedMetrics(reg), groups: map[string]*subscriptionGroup{}}
}

// subscriptionGroup is one execution shared by its members.
type subscriptionGroup struct {
	set    *subscriptionGroups
	key    string
	cancel context.CancelFunc

	mu      sync.RWMutex // members read under RLock, all at once after a broadcast
	members int
	gone    bool // left the set: no member may join any more
	ended   bool // the execution returned its last response
	dropped bool // ... because the live feed stopped on its own
	pending []string
	slots   []groupSlot
	index   map[string]int
	changed chan struct{}
	// watchers are the members that are told of every change (websocket
	// members, written by the fan-out) instead of waiting on changed;
	// notifying is the run goroutine's reusable copy of them.
	watchers  []*groupMember
	notifying []*groupMember
	waking    []*sockWriter
}

// groupSlot is the newest response for one SKU (or, for a response no
// value led to, such as an error at subscribe time, the slot ""), and its
// JSON encoding, made once for every websocket member.
type groupSlot struct {
	resp *gqlgen.Response
	enc  []byte
	ver  uint64
}

// join adds a member to the group of key, starting the group's execution
// when it is the first.
func (s *subscriptionGroups) join(key, field string, rc *gqlgen.OperationContext, exec gqlgen.GraphExecutor) *groupMember {
	s.mu.Lock()
	g := s.groups[key]
	if g == nil {
		ctx, cancel := context.WithCancel(context.Background())
		g = &subscriptionGroup{set: s, key: key, cancel: cancel, index: map[string]int{}, changed: make(chan struct{})}
		s.groups[key] = g
		s.m.groups.Inc()
		// The first member's operation context serves the group: it is
		// only read during execution (its headers, the one per-request
		// thing in it, mean nothing to a public field).
		go g.run(resolvers.WithStockObserver(ctx, g), rc, exec)
	}
	g.mu.Lock()
	g.members++
	g.mu.Unlock()
	s.mu.Unlock()
	s.m.members.Inc()
	sent, done := s.res.SubscriptionStarted(field)
	return &groupMember{g: g, sent: sent, done: done, watching: -1}
}

// run executes the subscription once for the whole group and publishes
// every response.
func (g *subscriptionGroup) run(ctx context.Context, rc *gqlgen.OperationContext, exec gqlgen.GraphExecutor) {
	defer g.cancel()
	ctx = gqlgen.WithOperationContext(ctx, rc)
	responses, ctx := exec.DispatchOperation(ctx, rc)
	for {
		resp := responses(ctx)
		if resp == nil {
			break
		}
		g.publish(resp)
	}
	g.set.remove(g)
	g.mu.Lock()
	g.ended = true
	close(g.changed)
	g.mu.Unlock()
	g.notify()
}

func (g *subscriptionGroup) publish(resp *gqlgen.Response) {
	// gqlgen reuses the buffer behind Data for the next response, which
	// the members may still be writing: they get a copy of their own.
	shared := *resp
	shared.Data = bytes.Clone(resp.Data)
	resp = &shared
	// What gqlgen's websocket transport writes as a message's payload.
	enc, err := json.Marshal(resp)
	if err != nil {
		panic(err) // as gqlgen's transports do: a response is always JSON
	}
	g.publishLocked(resp, enc)
	g.notify()
}

// notify tells every watcher that the group changed, outside the group's
// lock, from the run goroutine only.
func (g *subscriptionGroup) notify() {
	g.mu.RLock()
	g.notifying = append(g.notifying[:0], g.watchers...)
	g.mu.RUnlock()
	// The members' connections are queued for the shared writers
	// together, a run of connections of one set of writers at a time (a
	// server has one).
	waking := g.waking[:0]
	for _, m := range g.notifying {
		w := m.w
		if !w.markDirty() {
			continue
		}
		if len(waking) > 0 && waking[0].writers != w.writers {
			waking[0].writers.scheduleAll(waking)
			clear(waking)
			waking = waking[:0]
		}
		waking = append(waking, w)
	}
	if len(waking) > 0 {
		waking[0].writers.scheduleAll(waking)
	}
	clear(waking)
	g.waking = waking[:0]
	clear(g.notifying)
}

func (g *subscriptionGroup) publishLocked(resp *gqlgen.Response, enc []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	sku := ""
	if len(g.pending) > 0 {
		sku, g.pending = g.pending[0], g.pending[1:]
	}
	i, ok := g.index[sku]
	if !ok {
		i = len(g.slots)
		g.index[sku] = i
		g.slots = append(g.slots, groupSlot{})
	}
	g.slots[i] = groupSlot{resp: resp, enc: enc, ver: g.slots[i].ver + 1}
	close(g.changed)
	g.changed = make(chan struct{})
	g.set.m.executions.Inc()
}

// StockObserved queues the SKU of the value about to be executed.
func (g *subscriptionGroup) StockObserved(sku string) {
	g.mu.Lock()
	g.pending = append(g.pending, sku)
	g.mu.Unlock()
}

// StockDropped marks the end as a drop, which websocket members are told.
func (g *subscriptionGroup) StockDropped() {
	g.mu.Lock()
	g.dropped = true
	g.mu.Unlock()
}

// remove takes the group out of the set so no member joins it any more.
func (s *subscriptionGroups) remove(g *subscriptionGroup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	s.removeLocked(g)
}

// removeLocked is remove with s.mu and g.mu held.
func (s *subscriptionGroups) removeLocked(g *subscriptionGroup) {
	if g.gone {
		return
	}
	g.gone = true
	if s.groups[g.key] == g {
		delete(s.groups, g.key)
	}
	s.m.groups.Dec()
}

// leave drops a member; the last one out stops the execution, in the same
// step as it leaves the set, so nobody joins a group that is stopping.
func (g *subscriptionGroup) leave(m *groupMember) {
	s := g.set
	s.mu.Lock()
	g.mu.Lock()
	m.unwatchLocked()
	m.watching = memberLeft
	g.members--
	last := g.members == 0
	if last {
		s.removeLocked(g)
	}
	g.mu.Unlock()
	s.mu.Unlock()
	s.m.members.Dec()
	if last {
		g.cancel()
	}
}

// groupMember is one client subscription served by a group.
type groupMember struct {
	g       *subscriptionGroup
	seen    []uint64 // per slot of the group: the version last taken
	turn    int      // round-robin start, so one busy SKU cannot starve another
	release func()
	sent    func()
	done    func(reason string)
	left    bool
	// For a watcher: the connection woken on every change of the group,
	// and its place in the group's watchers (-1 when it is not one,
	// memberLeft once it left the group).
	w        *sockWriter
	watching int
}

// memberState is what a member finds when it looks at its group.
type memberState int

const (
	memberWaiting memberState = iota // nothing new yet
	memberValue                      // a response it has not had
	memberEnded                      // the group ended: nothing more will come
	memberDropped                    // ... because the live feed stopped on its own
)

// take returns the next response the member has not had, the newest of its
// SKU, or what it should wait for; it never blocks. changed is closed on
// the group's next change.
func (m *groupMember) take() (slot groupSlot, state memberState, changed <-chan struct{}) {
	g := m.g
	g.mu.RLock()
	defer g.mu.RUnlock()
	for len(m.seen) < len(g.slots) {
		m.seen = append(m.seen, 0)
	}
	n := len(g.slots)
	for k := 0; k < n; k++ {
		i := (m.turn + k) % n
		if sl := g.slots[i]; sl.ver > m.seen[i] {
			m.seen[i] = sl.ver
			m.turn = (i + 1) % n
			return sl, memberValue, nil
		}
	}
	switch {
	case g.ended && g.dropped:
		return groupSlot{}, memberDropped, nil
	case g.ended:
		return groupSlot{}, memberEnded, nil
	}
	return groupSlot{}, memberWaiting, g.changed
}

// next is the member's gqlgen.ResponseHandler: the next response it has
// not had, the newest of its SKU, or nil when the client left or the group
// ended.
func (m *groupMember) next(ctx context.Context) *gqlgen.Response {
	for {
		if ctx.Err() != nil {
			m.end("client")
			return nil
		}
		slot, state, changed := m.take()
		switch state {
		case memberValue:
			m.sent()
			return slot.resp
		case memberDropped:
			m.end("dropped")
			return nil
		case memberEnded:
			m.end("complete")
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
}

// watch makes m a watcher: w is woken (from the group's run goroutine,
// with no lock held) after every change, and once now, so a member
// joining a group that has values already takes them.
//
// A member that left already (its connection closed while it joined)
// does not become one.
func (m *groupMember) watch(w *sockWriter) {
	g := m.g
	g.mu.Lock()
	if m.watching == memberLeft {
		g.mu.Unlock()
		return
	}
	m.w = w
	m.watching = len(g.watchers)
	g.watchers = append(g.watchers, m)
	g.mu.Unlock()
	w.wake()
}

// memberLeft is the watching of a member that left its group: it is no
// watcher and may not become one.
const memberLeft = -2

// unwatchLocked takes m out of the group's watchers; g.mu is held.
func (m *groupMember) unwatchLocked() {
	g := m.g
	i := m.watching
	if i < 0 || i >= len(g.watchers) || g.watchers[i] != m {
		return
	}
	last := len(g.watchers) - 1
	g.watchers[i] = g.watchers[last]
	g.watchers[i].watching = i
	g.watchers[last] = nil
	g.watchers = g.watchers[:last]
	m.watching = -1
}

func (m *groupMember) end(reason string) {
	if m.left {
		return
	}
	m.left = true
	m.release()
	m.done(reason)
	m.g.leave(m)
}

// sharedMetrics count the groups, their members and executions.
type sharedMetrics struct {
	groups     prometheus.Gauge
	members    prometheus.Gauge
	executions prometheus.Counter
}

func newSharedMetrics(reg prometheus.Registerer) *sharedMetrics {
	return &sharedMetrics{
		groups: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_graphql_shared_subscriptions",
			Help: "Groups of identical subscriptions executed once for all their members.",
		})),
		members: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_graphql_shared_subscription_members",
			Help: "Client subscriptions served by a shared execution.",
		})),
		executions: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_graphql_shared_executions_total",
			Help: "Executions of shared subscriptions (one per update per group, whatever its members).",
		})),
	}
}
