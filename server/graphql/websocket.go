package graphql

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/internal/websocket"
)

// Websocket close codes Dropline sends beyond the protocol's own (1000
// normal, 1002 protocol error, e.g. no connection_init within InitTimeout,
// 1009 a message over MessageBytes). They follow the graphql-ws library's
// CloseCode: its client retries after 4403 (with fresh connectionParams,
// hence a fresh token) and gives up after 4429.
const (
	// CloseForbidden: the token in connection_init or in the upgrade's
	// Authorization header is invalid, or the connection's token expired.
	CloseForbidden = 4403
	// CloseTooManyConnections: the principal has ConnsPerPrincipal open.
	CloseTooManyConnections = 4429
)

// The subprotocols, in the order a client offering both is answered.
const (
	subprotocolGraphQLWS          = "graphql-ws"           // the legacy subscriptions-transport-ws protocol
	subprotocolGraphQLTransportWS = "graphql-transport-ws" // the graphql-ws library's protocol
)

var subprotocols = []string{subprotocolGraphQLWS, subprotocolGraphQLTransportWS}

// wsTransport serves subscriptions (and any operation a client sends that
// way) over websockets: graphql-transport-ws (the graphql-ws library's
// protocol, used by Apollo Client, urql and Relay) and the legacy
// graphql-ws subprotocol. It speaks both exactly as gqlgen's websocket
// transport does, message for message and byte for byte, and adds the
// origin check, auth at connection_init and bounded writes. It is built
// for tens of thousands of idle subscribers: a connection is one goroutine
// (its reader) and a small read buffer; writes are made by a few shared
// writers (streamwriters.go), and keep-alives, pong deadlines, init
// timeouts and token expiry by one shared ticker (keepaliveticker.go).
type wsTransport struct {
	limits  StreamLimits
	origins cors
	init    wsInitFunc
	groups  *subscriptionGroups // nil: every subscription executed on its own
	writers *streamWriters
	ticker  *keepaliveTicker
}

func newWebsocket(l StreamLimits, origins cors, v auth.Verifier, m *streamMetrics, groups *subscriptionGroups) *wsTransport {
	return &wsTransport{
		limits:  l,
		origins: origins,
		init:    wsInit(v, m),
		groups:  groups,
		writers: newStreamWriters(),
		ticker:  newKeepaliveTicker(l),
	}
}

var _ gqlgen.Transport = (*wsTransport)(nil)

// Supports claims every upgrade request, as gqlgen's transport does.
func (t *wsTransport) Supports(r *http.Request) bool { return header.Get(r.Header, "Upgrade") != "" }

// Do upgrades the request and serves the connection until it ends.
func (t *wsTransport) Do(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor) {
	ctx := r.Context()
	// A second line of defence: the CORS middleware already answers 403
	// to origins off the allow-list.
	if !t.origins.Allowed(header.Get(r.Header, "Origin"), r.Host) {
		zerolog.Ctx(ctx).Debug().Msg("websocket origin not allowed")
		transport.SendErrorf(w, http.StatusBadRequest, "unable to upgrade")
		return
	}
	if err := websocket.CheckHandshake(w, r); err != nil {
		var he *websocket.HandshakeError
		if errors.As(err, &he) {
			http.Error(w, he.Msg, he.Status)
		}
		zerolog.Ctx(ctx).Debug().Err(err).Msg("websocket handshake refused")
		transport.SendErrorf(w, http.StatusBadRequest, "unable to upgrade")
		return
	}
	proto := websocket.SelectSubprotocol(r, subprotocols)
	netConn, br, err := websocket.Upgrade(w, r, proto)
	if err != nil {
		zerolog.Ctx(ctx).Debug().Err(err).Msg("websocket upgrade failed")
		if errors.Is(err, http.ErrNotSupported) {
			http.Error(w, http.StatusText(http.StatusNotImplemented), http.StatusNotImplemented)
		}
		return
	}
	c := newWSConn(t, netConn, br, r, exec, proto)
	c.serve() //nolint:contextcheck // the connection's context derives from r's (newWSConn)
}

// wsInitFunc authenticates a connection at connection_init. It returns the
// connection's context, and when its token expires (zero: never); or the
// close code and reason that refuse it.
type wsInitFunc func(ctx context.Context, payload transport.InitPayload) (context.Context, time.Time, *wsRefusal)

// wsRefusal closes a connection at connection_init.
type wsRefusal struct {
	code   int
	reason string
}

// wsInit authenticates a websocket at connection_init. The token comes from
// the payload ("Authorization": "Bearer …", or "authToken": "…" as Apollo
// clients send it) or else from the upgrade request's Authorization header
// (already verified by auth.Middleware, which refused a bad one with 401). No token is an anonymous
// connection, enough for stockChanged. A bad token in the payload closes
// the connection with 4403; a good one ends it with 4403 when it expires.
func wsInit(v auth.Verifier, m *streamMetrics) wsInitFunc {
	return func(ctx context.Context, payload transport.InitPayload) (context.Context, time.Time, *wsRefusal) {
		p, have := auth.PrincipalFrom(ctx)
		if header := initToken(payload); header != "" {
			var err error
			p, _, err = auth.FromHeader(v, header)
			if err != nil {
				m.refused.WithLabelValues("bad_token").Inc()
				return ctx, time.Time{}, &wsRefusal{CloseForbidden, "Forbidden: " + tokenProblem(err)}
			}
			have = true
			ctx = auth.WithPrincipal(ctx, p)
		}
		c := streamConnFrom(ctx)
		if !have || c == nil {
			return ctx, time.Time{}, nil
		}
		if !c.bindPrincipal(p) {
			m.refused.WithLabelValues("principal_limit").Inc()
			return ctx, time.Time{}, &wsRefusal{CloseTooManyConnections, "Too many connections for this principal"}
		}
		return ctx, p.ExpiresAt, nil
	}
}

// initToken returns the connection_init payload's token as an
// Authorization header value.
func initToken(p transport.InitPayload) string {
	if h := p.Authorization(); h != "" {
		return h
	}
	t := strings.TrimSpace(p.GetString("authToken"))
	if t == "" {
		return ""
	}
	if scheme, _, ok := strings.Cut(t, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return t
	}
	return "Bearer " + t
}

func tokenProblem(err error) string {
	if errors.Is(err, auth.ErrTokenExpired) {
		return "token expired"
	}
	return "invalid token"
}

// subscriptionErrorsKey carries, in a subscription's context, the errors
// it ends with instead of "complete" (SubscriptionError).
type subscriptionErrorsKey struct{}

// subscriptionErrors are what a subscription ends with instead of
// "complete". A resolver adds to them from its own goroutine, and may do so
// while the transport is ending the subscription: a resolver that found its
// feed gone while its context was alive reports the drop, and that context
// can end meanwhile, which ends the transport's wait for the next response
// without waiting for the resolver. So the list is guarded, the transport
// takes it once, and what is added after that is not sent: the
// subscription has ended.
type subscriptionErrors struct {
	mu    sync.Mutex
	errs  []*gqlerror.Error
	taken bool
}

func (se *subscriptionErrors) add(err *gqlerror.Error) {
	se.mu.Lock()
	defer se.mu.Unlock()
	if !se.taken {
		se.errs = append(se.errs, err)
	}
}

// take returns the errors added so far and closes the list.
func (se *subscriptionErrors) take() []*gqlerror.Error {
	se.mu.Lock()
	defer se.mu.Unlock()
	se.taken = true
	return se.errs
}

func withSubscriptionErrors(ctx context.Context) (context.Context, *subscriptionErrors) {
	se := &subscriptionErrors{}
	return context.WithValue(ctx, subscriptionErrorsKey{}, se), se
}
