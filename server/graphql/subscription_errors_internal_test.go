package graphql

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// droppingExecutor runs every operation as a stream resolver that is
// interrupted at the worst moment: its feed stops, it finds its context
// still alive (so the drop is its to report), and before it reports the
// drop the subscription's context ends, which ends the transport's wait
// for the next response at the same time. The resolver then reports the
// drop, as resolvers.awaitChange does, from its own goroutine.
type droppingExecutor struct {
	gqlgen.GraphExecutor
	checked chan struct{} // the resolver found its context alive
}

func (e droppingExecutor) DispatchOperation(ctx context.Context, _ *gqlgen.OperationContext) (gqlgen.ResponseHandler, context.Context) {
	out := make(chan struct{})
	go func() {
		defer close(out)
		if ctx.Err() != nil {
			return
		}
		e.checked <- struct{}{}
		<-ctx.Done()
		streamConnFrom(ctx).SubscriptionError(ctx, &gqlerror.Error{Message: "live updates stopped"})
	}()
	return func(ctx context.Context) *gqlgen.Response {
		select { // as gqlgen's stream fields wait
		case <-out:
		case <-ctx.Done():
		}
		return nil
	}, ctx
}

// A resolver may report a subscription's end (SubscriptionError) while the
// transport is ending that subscription because its context ended: the
// report and the transport's look at the errors must not race (run under
// -race), and the subscription ends with exactly one message.
func TestSubscriptionErrorWhileTheSubscriptionEnds(t *testing.T) {
	t.Parallel()
	limits := StreamLimits{}.withDefaults()
	m := newStreamMetrics(prometheus.NewRegistry())
	tr := newWebsocket(limits, newCORS(nil), nil, m, nil)
	for round := range 20 {
		exec := droppingExecutor{checked: make(chan struct{})}
		c, client := wsConnOverPipe(tr, m, exec)
		ctx, cancel := context.WithCancel(c.ctx)
		sub := &wsSub{id: "1", cancel: cancel, release: func() {}}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.execute(ctx, &gqlgen.OperationContext{}, sub)
		}()
		<-exec.checked
		cancel()

		kind, err := nextMessageFor(client, "1")
		require.NoError(t, err, "round %d", round)
		require.Contains(t, []string{"complete", "error"}, kind, "round %d", round)
		<-done
		c.teardown()
		_ = client.Close()
	}
}

// nextMessageFor reads server frames from a client's end of the connection
// until a message for the operation id arrives, and returns its type.
func nextMessageFor(client net.Conn, id string) (string, error) {
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(client)
	for {
		var h [2]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return "", err
		}
		n := int(h[1] & 0x7f)
		switch n {
		case 126:
			var ext [2]byte
			if _, err := io.ReadFull(br, ext[:]); err != nil {
				return "", err
			}
			n = int(binary.BigEndian.Uint16(ext[:]))
		case 127:
			var ext [8]byte
			if _, err := io.ReadFull(br, ext[:]); err != nil {
				return "", err
			}
			n = int(binary.BigEndian.Uint64(ext[:]))
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(br, p); err != nil {
			return "", err
		}
		var msg struct{ ID, Type string }
		if h[0]&0x0f == 0x1 && json.Unmarshal(p, &msg) == nil && msg.ID == id {
			return msg.Type, nil
		}
	}
}
