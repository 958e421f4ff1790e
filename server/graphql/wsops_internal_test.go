package graphql

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// blockingExecutor runs every operation until the test lets it finish:
// started says an operation began, and each value on finish ends one.
type blockingExecutor struct {
	gqlgen.GraphExecutor
	started chan struct{}
	finish  chan struct{}
}

func (blockingExecutor) CreateOperationContext(context.Context, *gqlgen.RawParams) (*gqlgen.OperationContext, gqlerror.List) {
	return &gqlgen.OperationContext{}, nil
}

func (e blockingExecutor) DispatchOperation(ctx context.Context, _ *gqlgen.OperationContext) (gqlgen.ResponseHandler, context.Context) {
	e.started <- struct{}{}
	done := false
	return func(ctx context.Context) *gqlgen.Response {
		if done {
			return nil
		}
		done = true
		select {
		case <-e.finish:
		case <-ctx.Done():
		}
		return &gqlgen.Response{Data: json.RawMessage(`{"__typename":"Query"}`)}
	}, ctx
}

func (blockingExecutor) DispatchError(_ context.Context, list gqlerror.List) *gqlgen.Response {
	return &gqlgen.Response{Errors: list}
}

// TestOperationsInFlightAreCapped: the cap on a websocket's operations
// counts queries and mutations until they are answered, not only
// subscriptions: one over the cap is answered with an error and complete
// without running, and once one in flight is answered, the next runs.
func TestOperationsInFlightAreCapped(t *testing.T) {
	t.Parallel()
	const capacity = 3
	limits := StreamLimits{SubscriptionsPerConn: capacity, WriteTimeout: time.Minute}.withDefaults()
	m := newStreamMetrics(prometheus.NewRegistry())
	tr := newWebsocket(limits, newCORS(nil), nil, m, nil)
	exec := blockingExecutor{started: make(chan struct{}, 16), finish: make(chan struct{})}
	c, client := wsConnOverPipe(tr, m, exec)
	served := make(chan struct{})
	go func() {
		defer close(served)
		c.serve()
	}()
	t.Cleanup(func() { <-served })
	t.Cleanup(func() { _ = client.Close() })
	got := readServerMessages(client)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(msg string) {
		_, err := client.Write(maskedText(msg))
		require.NoError(t, err)
	}
	next := func() string {
		select {
		case m := <-got:
			return m
		case <-ctx.Done():
			t.Fatal("no message from the server")
			return ""
		}
	}
	query := func(id int) string {
		return fmt.Sprintf(`{"id":"%d","type":"subscribe","payload":{"query":"{ __typename }"}}`, id)
	}
	waitStarted := func() {
		select {
		case <-exec.started:
		case <-ctx.Done():
			t.Fatal("an operation did not start")
		}
	}

	send(`{"type":"connection_init"}`)
	require.Equal(t, `{"type":"connection_ack"}`, next())
	for id := 1; id <= capacity; id++ {
		send(query(id))
		waitStarted()
	}
	send(query(capacity + 1))
	refusal := next()
	require.Contains(t, refusal, fmt.Sprintf(`"id":"%d","type":"next"`, capacity+1))
	require.Contains(t, refusal, `"errors":[`)
	require.Contains(t, refusal, "too many operations in flight on this connection")
	require.Equal(t, fmt.Sprintf(`{"id":"%d","type":"complete"}`, capacity+1), next())
	require.Empty(t, exec.started, "the refused operation ran")

	exec.finish <- struct{}{} // one answer: a place is free
	require.Contains(t, next(), `{"data":{"__typename":"Query"}}`)
	require.Contains(t, next(), `"type":"complete"`)
	send(query(capacity + 2))
	waitStarted()
	send(query(capacity + 3))
	require.Contains(t, next(), "too many operations in flight on this connection")
	require.Equal(t, fmt.Sprintf(`{"id":"%d","type":"complete"}`, capacity+3), next())
	close(exec.finish)
}

// readServerMessages reads the server's text frames from a pipe's client
// end, each final and unmasked, until it fails.
func readServerMessages(client net.Conn) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		br := bufio.NewReader(client)
		for {
			var h [2]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return
			}
			n := int(h[1] & 0x7f)
			if n == 126 {
				var ext [2]byte
				if _, err := io.ReadFull(br, ext[:]); err != nil {
					return
				}
				n = int(ext[0])<<8 | int(ext[1])
			}
			p := make([]byte, n)
			if _, err := io.ReadFull(br, p); err != nil {
				return
			}
			out <- string(p)
		}
	}()
	return out
}
