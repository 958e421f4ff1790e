package graphql

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"testing"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestDataMessagesEncodeLikeJSONMarshal: the fast encoding of data messages
// writes exactly what encoding/json writes for a protocol message, ids
// that need escaping included, and says its length beforehand.
func TestDataMessagesEncodeLikeJSONMarshal(t *testing.T) {
	t.Parallel()
	payload, err := json.Marshal(map[string]any{"data": map[string]any{"stockChanged": map[string]any{
		"sku": "A<b>&c", "available": 3, "note": "\u2028 \"quoted\""}}})
	require.NoError(t, err)
	for _, m := range []outMessage{
		{Payload: payload, ID: "1", Type: "next"},
		{Payload: payload, ID: `we"ird<id>&\u2028`, Type: "next"},
		{Payload: payload, ID: "7", Type: "data"},
		{Payload: payload, Type: "next"},
	} {
		want, err := json.Marshal(&m)
		require.NoError(t, err)
		id, err := json.Marshal(m.ID)
		require.NoError(t, err)
		got := appendDataMessage(nil, m.Payload, id, m.Type)
		require.Equal(t, string(want), string(got))
		require.Equal(t, len(want), dataMessageLen(m.Payload, id, m.Type))
	}
}

// The writers' queue stays as long as what waits in it when it never
// empties: a worker (one of two, so its share of two is one) that takes
// one connection while another is scheduled, a hundred thousand times,
// leaves a queue of one.
func TestWriterQueueDoesNotGrowWhileItNeverEmpties(t *testing.T) {
	p := &streamWriters{max: 0} // no worker starts: the test is the worker
	p.workers = 2
	a, b := &wsConn{}, &wsConn{}
	p.schedule(a)
	for range 100_000 {
		p.schedule(b)
		require.Len(t, p.next(nil), 1)
	}
	require.Len(t, p.queue[p.head:], 1)
	require.Less(t, cap(p.queue), 64, "the queue kept every connection it ever had")
	require.Len(t, p.next(nil), 1)
	require.Empty(t, p.next(nil), "an empty queue ends its worker")
	require.Equal(t, 1, p.workers)
}

// A group's change queues all its members' connections at once; the
// writers take them in batches of at most writerBatch, each its share when
// there are fewer, every connection exactly once and in order, and a
// connection already queued is not queued again.
func TestWritersTakeAGroupsConnectionsInBatches(t *testing.T) {
	p := &streamWriters{max: 0, workers: 2} // no worker starts: the test is the writers
	ws := make([]*sockWriter, 100)
	for i := range ws {
		ws[i] = &sockWriter{writers: p}
	}
	var marked []*sockWriter
	for _, w := range ws {
		if w.markDirty() {
			marked = append(marked, w)
		}
	}
	for _, w := range ws[:10] {
		require.False(t, w.markDirty(), "a queued connection is queued once")
	}
	p.scheduleAll(marked)
	var taken []mailbox
	var sizes []int
	for {
		b := p.next(nil)
		if len(b) == 0 {
			break
		}
		sizes = append(sizes, len(b))
		taken = append(taken, b...)
	}
	require.Len(t, taken, len(ws))
	for i, w := range ws {
		require.Same(t, w, taken[i].(*sockWriter))
	}
	// 100 for two writers: a full batch while there are more than two
	// batches left, then half of what is left, down to one.
	require.Equal(t, []int{32, 32, 18, 9, 4, 2, 1, 1, 1}, sizes)
	require.Equal(t, 1, p.workers, "the writer that found the queue empty ended")
}

// A member whose end was decided before it began to watch its group (its
// connection closed by the keep-alive ticker, or the server stopping, while
// it joined) is not left among the group's watchers: the group would keep
// it, and wake its connection on every change, for as long as it lives.
func TestMemberThatLeftIsNotAWatcher(t *testing.T) {
	s := newSubscriptionGroups(nil, prometheus.NewRegistry())
	g := &subscriptionGroup{set: s, key: "k", cancel: func() {}, members: 2, changed: make(chan struct{})}
	member := func() *groupMember {
		return &groupMember{g: g, release: func() {}, sent: func() {}, done: func(string) {}, watching: -1}
	}
	gone, stays := member(), member()
	gone.end("client")
	writers := &streamWriters{max: 0, workers: 1} // no worker starts
	gone.watch(&sockWriter{writers: writers})
	stays.watch(&sockWriter{writers: writers})
	require.Equal(t, []*groupMember{stays}, g.watchers)
}

// wsConnOverPipe is a connection of tr (graphql-transport-ws, counted in
// m's stream caps) whose client is the other end of a net.Pipe, with no
// HTTP server and no upgrade.
func wsConnOverPipe(tr *wsTransport, m *streamMetrics, exec gqlgen.GraphExecutor) (c *wsConn, client net.Conn) {
	server, client := net.Pipe()
	state := &streamConn{kind: kindWebsocket, tracker: newStreamTracker(tr.limits, m)}
	req := httptest.NewRequest("GET", "/graphql", nil)
	req = req.WithContext(context.WithValue(req.Context(), streamConnKey{}, state))
	return newWSConn(tr, server, bufio.NewReader(server), req, exec, subprotocolGraphQLTransportWS), client
}
