package graphql_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/live"
)

const (
	queueFields = `id status admittedThrough waiting admitPerMinute seedHash`
	queueSub    = `subscription($s: ID) { queueChanged(sku: $s) { ` + queueFields + ` } }`
	joinQDoc    = `mutation($i: JoinQueueInput!) { joinQueue(input: $i) { ticket { number status } ` + userErrorFields + ` } }`
)

type queueState struct {
	ID, Status               string
	AdmittedThrough, Waiting int
	AdmitPerMinute           int
	SeedHash                 string
}

func queuePayload(t *testing.T, m wsclient.Message) queueState {
	t.Helper()
	require.Empty(t, m.Errors)
	var out struct{ QueueChanged queueState }
	require.NoError(t, json.Unmarshal(m.Data, &out), "%s", m.Data)
	return out.QueueChanged
}

// TestQueueChangedOverWebsocket: waiters of a queued product watch
// queueChanged over real websockets while an admission ticker (Step every
// 250 ms, as the worker's admitter) runs. Every waiter gets the same value
// per step, admittedThrough never goes back, the admitted buy with their
// passes, and every waiter is told SOLD_OUT within a second of the last
// unit sold; Redis and the ledger agree on who bought.
func TestQueueChangedOverWebsocket(t *testing.T) {
	testenv.Quiet(t)
	le := setupLive(t, live.HubConfig{ResyncInterval: -1}) // no periodic re-read: the polls below must cost no Redis command
	e := le.env
	const units, people, watchers = 3, 6, 4
	e.CreateProduct(t, map[string]any{"sku": "QW-1", "stock": units, "queue": map[string]any{
		"opensAt": time.Now().Add(-time.Second).Format(time.RFC3339Nano), "admitPerMinute": 60000}})
	ref := queue.Ref{Kind: queue.OfProduct, ID: "QW-1"}

	tokens := make([]string, people)
	for i := range people {
		tokens[i] = e.Token(t, fmt.Sprintf("qw-%d", i), false)
		var out struct {
			JoinQueue struct {
				Ticket     struct{ Number int }
				UserErrors []struct{ Code string }
			}
		}
		e.MustDo(t, tokens[i], joinQDoc, map[string]any{"i": map[string]any{"sku": "QW-1"}}, &out)
		require.Empty(t, out.JoinQueue.UserErrors)
		require.Equal(t, i+1, out.JoinQueue.Ticket.Number)
	}

	subs := make([]*wsclient.Subscription, watchers)
	for i := range watchers {
		proto := wsclient.TransportWS
		if i%2 == 1 {
			proto = wsclient.LegacyWS
		}
		c := le.dial(t, wsclient.Options{Subprotocol: proto})
		subs[i] = subscribe(t, c, queueSub, map[string]any{"s": "QW-1"})
		first := queuePayload(t, mustNext(t, subs[i]))
		require.Equal(t, "sku:QW-1", first.ID)
		require.Equal(t, 0, first.AdmittedThrough)
		require.Equal(t, people, first.Waiting)
		require.Equal(t, 60000, first.AdmitPerMinute)
		require.Len(t, first.SeedHash, 64)
	}

	// A waiter's poll is answered from memory: its number (seen at its join)
	// and the hub's state of the queue, without a Redis command. Only the
	// polls' own commands are counted (their requests' contexts carry
	// pollMark): the hub re-reads the queue on its own goroutines when its
	// feed is made and again when Redis confirms the feed's channel, and
	// those re-reads, legitimately, may still be under way when the polls
	// begin.
	queueCmds := &keyCounter{part: "sku:QW-1", mark: pollMark{}}
	e.Redis.AddHook(queueCmds)
	markPoll := func(r *client.Request) {
		r.HTTP = r.HTTP.WithContext(context.WithValue(r.HTTP.Context(), pollMark{}, true))
	}
	for range 20 {
		var poll struct {
			MyQueueTicket struct {
				Number, Position, PollAfterSeconds int
				Status                             string
			}
		}
		resp, err := e.Client.RawPost(`{ myQueueTicket(sku: "QW-1") { number position status pollAfterSeconds } }`,
			client.AddHeader("Authorization", tokens[people-1]), markPoll)
		require.NoError(t, err)
		require.Empty(t, resp.Errors)
		data, err := json.Marshal(resp.Data)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &poll))
		require.Equal(t, "WAITING", poll.MyQueueTicket.Status)
		require.Equal(t, people, poll.MyQueueTicket.Position)
		require.Positive(t, poll.MyQueueTicket.PollAfterSeconds)
	}
	require.Zero(t, queueCmds.n.Load(), "Redis commands on the queue's keys for 20 polls of a waiting ticket")

	// The admission ticker.
	qs := queue.New(queue.Config{}, e.Redis, e.Engine)
	ctx, stop := context.WithCancel(context.Background())
	ticker := make(chan struct{})
	go func() {
		defer close(ticker)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := qs.Step(ctx, ref); err != nil && ctx.Err() == nil {
				t.Errorf("step: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { stop(); <-ticker })

	// Every waiter sees the step that admits as many as there are units.
	for _, s := range subs {
		got := awaitQueue(t, s, 3*time.Second, func(q queueState) bool { return q.AdmittedThrough == units })
		require.Equal(t, "OPEN", got.Status)
		require.Equal(t, people-units, got.Waiting, "tickets given and not admitted")
	}

	// The admitted buy; the last commit is the moment every waiter must learn of.
	var soldAt time.Time
	sold := map[string]string{} // token -> principal
	for i := range units {
		var mine struct{ MyQueueTicket struct{ Status, Pass string } }
		e.MustDo(t, tokens[i], `{ myQueueTicket(sku: "QW-1") { status pass } }`, nil, &mine)
		require.Equal(t, "ADMITTED", mine.MyQueueTicket.Status, "ticket %d", i+1)
		r := e.Reserve(t, tokens[i], map[string]any{"sku": "QW-1", "quantity": 1, "admissionPass": mine.MyQueueTicket.Pass})
		require.Empty(t, r.UserErrors)
		c := e.Commit(t, tokens[i], r.Reservation.Token)
		require.Empty(t, c.UserErrors)
		soldAt = time.Now()
		sold[r.Reservation.Token] = fmt.Sprintf("qw-%d", i)
	}
	var mine struct{ MyQueueTicket struct{ Status string } }
	e.MustDo(t, tokens[units], `{ myQueueTicket(sku: "QW-1") { status } }`, nil, &mine)
	require.Contains(t, []string{"WAITING", "SOLD_OUT"}, mine.MyQueueTicket.Status, "nobody past the units is admitted")

	for i, s := range subs {
		got := awaitQueue(t, s, 2*time.Second, func(q queueState) bool { return q.Status == "SOLD_OUT" })
		late := time.Since(soldAt)
		require.Less(t, late, time.Second, "waiter %d told SOLD_OUT %s after the last sale", i, late)
		require.Equal(t, units, got.AdmittedThrough)
	}

	// Redis and the ledger agree: every unit sold once, to an admitted principal.
	truth := e.Truth(t, "QW-1")
	require.Equal(t, units, truth.Sold)
	require.Equal(t, 0, truth.Available+truth.Held)
	rows, err := e.Pool.Query(context.Background(), `SELECT token, principal, status FROM reservations WHERE sku = $1`, "QW-1")
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var tok, who, st string
		require.NoError(t, rows.Scan(&tok, &who, &st))
		require.Equal(t, "COMMITTED", st, tok)
		require.Equal(t, sold[tok], who, "the ledger's buyer of %s", tok)
		seen++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, units, seen, "ledger rows")
}

// pollMark marks the context of a request whose Redis commands a
// keyCounter counts.
type pollMark struct{}

// keyCounter counts the Redis commands naming a key that contains part,
// sent under a context carrying the value mark.
type keyCounter struct {
	part string
	mark any
	n    atomic.Int64
}

func (c *keyCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *keyCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(ctx, cmd)
		return next(ctx, cmd)
	}
}

func (c *keyCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(ctx, cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *keyCounter) count(ctx context.Context, cmd redis.Cmder) {
	if ctx.Value(c.mark) == nil {
		return
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, c.part) {
			c.n.Add(1)
			return
		}
	}
}

func mustNext(t *testing.T, s *wsclient.Subscription) wsclient.Message {
	t.Helper()
	m, ok := next(t, s, 5*time.Second)
	require.True(t, ok, "stream ended")
	return m
}

// awaitQueue reads s until a value satisfies ok, checking that
// admittedThrough never goes back, and fails after d.
func awaitQueue(t *testing.T, s *wsclient.Subscription, d time.Duration, ok func(queueState) bool) queueState {
	t.Helper()
	deadline := time.Now().Add(d)
	through := 0
	for {
		m, more := next(t, s, time.Until(deadline)+time.Millisecond)
		require.True(t, more, "stream ended")
		q := queuePayload(t, m)
		require.GreaterOrEqual(t, q.AdmittedThrough, through, "admittedThrough never goes back")
		through = q.AdmittedThrough
		if ok(q) {
			return q
		}
	}
}
