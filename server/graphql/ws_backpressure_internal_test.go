package graphql

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/websocket"
)

// answeringExecutor answers every operation with one response at once.
type answeringExecutor struct{ gqlgen.GraphExecutor }

func (answeringExecutor) CreateOperationContext(context.Context, *gqlgen.RawParams) (*gqlgen.OperationContext, gqlerror.List) {
	return &gqlgen.OperationContext{}, nil
}

func (answeringExecutor) DispatchOperation(ctx context.Context, _ *gqlgen.OperationContext) (gqlgen.ResponseHandler, context.Context) {
	done := false
	return func(context.Context) *gqlgen.Response {
		if done {
			return nil
		}
		done = true
		return &gqlgen.Response{Data: json.RawMessage(`{"__typename":"Query"}`)}
	}, ctx
}

func (answeringExecutor) DispatchError(_ context.Context, list gqlerror.List) *gqlgen.Response {
	return &gqlgen.Response{Errors: list}
}

// maskedText frames msg as a client does.
func maskedText(msg string) []byte {
	mask := [4]byte{1, 2, 3, 4}
	b := websocket.AppendHeader(nil, websocket.OpText, len(msg))
	b[1] |= 0x80
	b = append(b, mask[:]...)
	for i := range len(msg) {
		b = append(b, msg[i]^mask[i%4])
	}
	return b
}

// A client that sends operations and never reads their answers does not
// make the server start one goroutine per operation: once the answers
// queued for it are over the outbox's bound, the server reads no more
// operations until they are taken (or the connection is dropped).
func TestOperationsWaitForTheOutboxOfAClientThatDoesNotRead(t *testing.T) {
	t.Parallel()
	limits := StreamLimits{WriteTimeout: time.Minute}.withDefaults()
	m := newStreamMetrics(prometheus.NewRegistry())
	tr := newWebsocket(limits, newCORS(nil), nil, m, nil)
	c, client := wsConnOverPipe(tr, m, answeringExecutor{}) // a pipe takes nothing the client does not read
	served := make(chan struct{})
	go func() {
		defer close(served)
		c.serve()
	}()
	t.Cleanup(func() { <-served }) // runs after the client's end is closed
	t.Cleanup(func() { _ = client.Close() })

	const ops = 3000
	wrote := make(chan int, 1)
	go func() {
		n := 0
		defer func() { wrote <- n }()
		if _, err := client.Write(maskedText(`{"type":"connection_init"}`)); err != nil {
			return
		}
		for i := range ops {
			msg := fmt.Sprintf(`{"id":"%d","type":"subscribe","payload":{"query":"{ __typename }"}}`, i)
			if _, err := client.Write(maskedText(msg)); err != nil {
				return
			}
			n++
		}
	}()
	// Either the client got every operation in, or the server stopped
	// reading them.
	select {
	case <-wrote:
	case <-time.After(2 * time.Second):
	}
	c.mu.Lock()
	running := len(c.active)
	c.mu.Unlock()
	require.Less(t, running, 100, "operations running (their answers waiting for a client that does not read)")
}
