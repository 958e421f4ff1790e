package graphql

import (
	"context"
	"errors"
	"net/http"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
)

// NewHandlerUnshared is NewHandler executing every subscription on its own,
// as gqlgen alone would, to compare against the shared execution.
func NewHandlerUnshared(cfg Config) http.Handler { return newHandler(cfg, handlerOptions{}) }

// NewHandlerGqlgenWebsocket is NewHandler with gqlgen's own websocket
// transport, with the same limits and authentication, to compare what the
// two answer.
func NewHandlerGqlgenWebsocket(cfg Config) http.Handler {
	return newHandler(cfg, handlerOptions{share: true, websocket: func(t *wsTransport) gqlgen.Transport {
		readLimit := t.limits.MessageBytes
		ws := transport.Websocket{
			InitFunc: func(ctx context.Context, p transport.InitPayload) (context.Context, *transport.InitPayload, error) {
				ctx, _, refusal := t.init(ctx, p)
				if refusal != nil {
					ctx = transport.WithWebsocketCloseCode(ctx, refusal.code)
					ctx = transport.AppendCloseReason(ctx, refusal.reason)
					return ctx, nil, errors.New(refusal.reason)
				}
				return ctx, nil, nil
			},
			InitTimeout:           t.limits.InitTimeout,
			KeepAlivePingInterval: t.limits.PingInterval,
			PingPongInterval:      t.limits.PingInterval,
			PayloadReadLimit:      &readLimit,
		}
		if t.groups == nil {
			return ws
		}
		return sharingTransport{inner: ws, groups: t.groups}
	}})
}
