package graphql

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"
	"unsafe"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"

	"github.com/dropline/dropline/internal/cpugate"
)

// NewHandlerUnshared is NewHandler executing every subscription on its own,
// as gqlgen alone would, to compare against the shared execution.
func NewHandlerUnshared(cfg Config) http.Handler { return newHandler(cfg, handlerOptions{}) }

// NewHandlerExecutingAll is NewHandler executing every operation, the
// reserves the sold-out memory refuses too, to compare with what the HTTP
// transport answers for them without executing them.
func NewHandlerExecutingAll(cfg Config) http.Handler {
	return newHandler(cfg, handlerOptions{share: true, noReserveAnswers: true})
}

// NewHandlerGatedExecutingAll is NewHandlerGated executing every
// operation, as NewHandlerExecutingAll.
func NewHandlerGatedExecutingAll(cfg Config, g *TestGate) http.Handler {
	return newHandler(cfg, handlerOptions{share: true, gate: g.g, noReserveAnswers: true})
}

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

// TestGate is a gate the test holds slots of.
type TestGate struct {
	g    *gate
	held []*cpugate.Ticket
}

// NewTestGate makes a gate of slots that waits at most wait.
func NewTestGate(slots int, wait time.Duration, reg prometheus.Registerer) *TestGate {
	return &TestGate{g: newGate(slots, wait, reg)}
}

// Hold takes a slot as a running operation would.
func (g *TestGate) Hold() {
	t := g.g.cpu.NewTicket()
	if _, err := t.Acquire(context.Background(), 0); err != nil {
		panic(err)
	}
	g.held = append(g.held, t)
}

// Release gives back the slot Hold took first.
func (g *TestGate) Release() {
	t := g.held[0]
	g.held = g.held[1:]
	t.Leave()
}

// NewHandlerGated is NewHandler with g as its gate.
func NewHandlerGated(cfg Config, g *TestGate) http.Handler {
	return newHandler(cfg, handlerOptions{share: true, gate: g.g})
}

// IsPriority parses query and reports whether its operation skips the gate.
func IsPriority(query string) (bool, error) {
	doc, err := parser.ParseQuery(&ast.Source{Input: query})
	if err != nil {
		return false, err
	}
	return isPriority(doc.Operations[0]), nil
}

// OperationContextMutators builds the handler NewHandler builds for cfg
// and names, by type, the operation context mutators of its gqlgen
// executor in the order gqlgen runs them. gqlgen keeps that list
// unexported; it is read by reflection, and an error says when gqlgen's
// layout no longer has it where this looks.
func OperationContextMutators(cfg Config) ([]string, error) {
	var srv *handler.Server
	newHandler(cfg, handlerOptions{share: true, server: func(s *handler.Server) { srv = s }})
	exec := reflect.ValueOf(srv).Elem().FieldByName("exec")
	if !exec.IsValid() || exec.Kind() != reflect.Pointer || exec.IsNil() {
		return nil, errors.New("gqlgen's handler.Server has no exec *executor.Executor")
	}
	ext := exec.Elem().FieldByName("ext")
	if !ext.IsValid() || ext.Kind() != reflect.Struct {
		return nil, errors.New("gqlgen's executor.Executor has no ext struct")
	}
	f := ext.FieldByName("operationContextMutators")
	want := reflect.TypeFor[[]gqlgen.OperationContextMutator]()
	if !f.IsValid() || f.Type() != want {
		return nil, errors.New("gqlgen's executor extensions have no operationContextMutators list")
	}
	ms := reflect.NewAt(want, unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().([]gqlgen.OperationContextMutator)
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = fmt.Sprintf("%T", m)
	}
	return names, nil
}
