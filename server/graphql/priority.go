package graphql

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/cpugate"
	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/internal/prom"
)

// The gate's sizes (Limits.GateSlots, Limits.GateWait): eight slots per
// core the process runs on when it is turned on, and ten seconds.
const (
	GateSlotsPerCPU = 8
	DefaultGateWait = 10 * time.Second
)

// SuggestedGateSlots is GateSlotsPerCPU times GOMAXPROCS, the size to
// start from when the gate is turned on: the slots bound the ordinary
// requests on the CPU that compete with a commit for each core. On two
// cores, 16: in the flash-sale rehearsal, 4 slots a process served the
// storm's commits sooner than 16 but answered the storm more slowly in
// two rounds of three (docs/benchmarks.md, "A gate for the CPU"). The
// gate is off unless asked for: on the loaded machine of those rounds, 16
// slots served the storm's commits sooner in four of six and answered the
// storm faster in three, slower in two.
func SuggestedGateSlots() int { return GateSlotsPerCPU * runtime.GOMAXPROCS(0) }

// priorityFields are the mutations that are money, or give units back: an
// operation made of these only is never made to wait at the gate.
var priorityFields = map[string]bool{
	"commit": true, "commitCart": true, "cancel": true, "cancelCart": true,
}

// gate serves payments ahead of the crowd. In a flash sale most requests
// are reserves of a sold-out SKU and reads, and on a process with a few
// cores each one in flight is a goroutine wanting the CPU: a commit, woken
// at each step (its body, Redis, PostgreSQL, its answer), waits in the run
// queue behind all of them. So every query and mutation that is not a
// priority operation holds one of the gate's slots while it is on the CPU
// (cpugate): it takes one as it comes in, before its token is checked and
// its body decoded, gives it back while it waits for Redis, a loader or the
// engine's reserve batch, and takes one again, ahead of the requests that
// have not started, when the wait ends. The others wait, parked (not
// runnable), in the order they came, for at most wait (or until their
// client goes). Priority operations (mutations whose root fields are all
// in priorityFields) skip it. Subscriptions are not gated: they are
// streams, bounded by the stream caps.
//
// Which operation a request carries is known once gqlgen has parsed it, so
// the HTTP middleware guesses from the body: one that names no priority
// field cannot be a priority operation and takes its slot at once; one
// that does (or a persisted query's hash alone) runs to its operation
// without a slot. There (InterceptOperation) a priority operation gives up
// any slot for good, and any other takes one before it executes, as does
// an operation sent over a websocket.
type gate struct {
	cpu  *cpugate.Gate // nil: the gate is off
	wait time.Duration

	waiting  prometheus.Gauge
	admitted *prometheus.CounterVec // by class
	refused  *prometheus.CounterVec // by reason
	waited   prometheus.Histogram
}

// Classes of the gate's admitted counter.
const (
	classPriority = "priority"
	classOrdinary = "ordinary"
)

// CodeBusy answers an operation that waited at the gate for longer than
// Limits.GateWait: retry after a second.
const CodeBusy = "SERVER_BUSY"

func newGate(slots int, wait time.Duration, reg prometheus.Registerer) *gate {
	g := &gate{
		wait: wait,
		waiting: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_graphql_gate_waiting",
			Help: "Requests waiting for a slot of the gate to start (not priority ones: those skip it).",
		})),
		admitted: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_gate_admitted_total",
			Help: "Operations let through the gate, by class: priority (commits and cancels, never wait) or ordinary (took a slot).",
		}, []string{"class"})),
		refused: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_gate_refused_total",
			Help: "Operations that left the gate without a slot, by reason: timeout (waited DROPLINE_GATE_WAIT, answered SERVER_BUSY) or gone (the client left).",
		}, []string{"reason"})),
		waited: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_graphql_gate_wait_seconds",
			Help:    "How long ordinary operations waited for a slot of the gate to start.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		})),
	}
	if slots > 0 {
		g.cpu = cpugate.New(slots)
		prom.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dropline_graphql_gate_in_use",
			Help: "Slots of the gate held by ordinary operations on the CPU.",
		}, func() float64 { return float64(g.cpu.InUse()) }))
		prom.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dropline_graphql_gate_slots",
			Help: "Slots of the gate (DROPLINE_GATE_SLOTS): ordinary operations on the CPU at once.",
		}, func() float64 { return float64(g.cpu.Slots()) }))
	}
	return g
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationInterceptor
} = (*gate)(nil)

// ExtensionName names the extension in gqlgen's stats.
func (*gate) ExtensionName() string { return "PriorityGate" }

// Validate accepts any schema.
func (*gate) Validate(gqlgen.ExecutableSchema) error { return nil }

// busyKey marks a request that waited at the gate for longer than
// allowed as it came in: its operation is answered SERVER_BUSY, unless it
// is a priority one.
type busyKey struct{}

// middleware gives every query and mutation over HTTP a ticket of the gate,
// and makes the ones that cannot be priority operations take a slot before
// anything else is done for them. A request whose client leaves while it
// waits is answered nothing.
func (g *gate) middleware(next http.Handler) http.Handler {
	if g.cpu == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !gatedRequest(r) {
			next.ServeHTTP(w, r)
			return
		}
		t := g.cpu.NewTicket()
		defer t.Leave()
		ctx := cpugate.WithTicket(r.Context(), t)
		if !mayBePriority(r) {
			switch ok, busy := g.take(ctx, t); {
			case busy:
				ctx = context.WithValue(ctx, busyKey{}, true)
			case !ok:
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// gatedRequest reports whether r is a query or mutation over plain HTTP:
// not a websocket's upgrade nor a stream over SSE (their operations are
// gated as they are executed), nor a CORS preflight.
func gatedRequest(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet:
		return header.Get(r.Header, "Upgrade") == ""
	case http.MethodPost:
		return !strings.Contains(header.Get(r.Header, "Accept"), "text/event-stream")
	}
	return false
}

// mayBePriority reports whether r's body may hold a priority operation: it
// names one of priorityFields, or names no query at all (a persisted
// query's or a trusted document's id). GET carries queries only.
func mayBePriority(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	rb, ok := r.Body.(*readBody)
	if !ok {
		return true
	}
	b := rb.b
	if !bytes.Contains(b, []byte(`"query"`)) {
		return true
	}
	for f := range priorityFields {
		if bytes.Contains(b, []byte(f)) {
			return true
		}
	}
	return false
}

// take takes a slot for t, waiting at most g.wait. ok is false when the
// client left; busy when the wait was too long.
func (g *gate) take(ctx context.Context, t *cpugate.Ticket) (ok, busy bool) {
	if t.Held() {
		return true, false
	}
	start := time.Now()
	g.waiting.Inc()
	waited, err := t.Acquire(ctx, g.wait)
	g.waiting.Dec()
	switch {
	case err == nil:
		g.admitted.WithLabelValues(classOrdinary).Inc()
		if waited {
			g.waited.Observe(time.Since(start).Seconds())
		} else {
			g.waited.Observe(0)
		}
		return true, false
	case errors.Is(err, cpugate.ErrTimeout):
		g.refused.WithLabelValues("timeout").Inc()
		return false, true
	default:
		g.refused.WithLabelValues("gone").Inc()
		return false, false
	}
}

// busyResponse answers an operation that waited for longer than g.wait.
func (g *gate) busyResponse() *gqlgen.Response {
	return &gqlgen.Response{Errors: gqlerror.List{{
		Message:    "the server is busy: this operation waited " + g.wait.String() + " for its turn; retry in a second",
		Extensions: map[string]any{"code": CodeBusy, "retryAfterSeconds": 1},
	}}}
}

// InterceptOperation lets a priority operation through at once, giving up
// any slot its request took, and makes any other query or mutation hold a
// slot for the making of its response: the one its request took as it
// came in, or one it takes now. The slot is taken inside the response
// handler, where the fields are resolved.
func (g *gate) InterceptOperation(ctx context.Context, next gqlgen.OperationHandler) gqlgen.ResponseHandler {
	op := gqlgen.GetOperationContext(ctx)
	if g.cpu == nil || op.Operation == nil || op.Operation.Operation == ast.Subscription {
		return next(ctx)
	}
	if isPriority(op.Operation) {
		if t := cpugate.FromContext(ctx); t != nil {
			t.Exempt()
		}
		g.admitted.WithLabelValues(classPriority).Inc()
		return next(ctx)
	}
	responses := next(ctx)
	admitted := false
	return func(ctx context.Context) *gqlgen.Response {
		if admitted {
			return responses(ctx) // a query or mutation has one response: never reached
		}
		admitted = true
		ctx, leave, resp, ok := g.admit(ctx)
		if !ok {
			return resp
		}
		defer leave()
		return responses(ctx)
	}
}

// admit makes sure the ordinary operation of ctx holds a slot, with ctx
// carrying its ticket, and returns what to call when it is done. When it
// cannot, it returns the response to give: nil when the client is gone
// (the transport writes nothing), SERVER_BUSY when the wait was too long.
func (g *gate) admit(ctx context.Context) (context.Context, func(), *gqlgen.Response, bool) {
	if busy, _ := ctx.Value(busyKey{}).(bool); busy {
		return ctx, nil, g.busyResponse(), false
	}
	t := cpugate.FromContext(ctx)
	leave := func() {}
	if t == nil {
		// Over a websocket: a ticket for this operation alone.
		t = g.cpu.NewTicket()
		ctx = cpugate.WithTicket(ctx, t)
		leave = t.Leave
	}
	switch ok, busy := g.take(ctx, t); {
	case busy:
		return ctx, nil, g.busyResponse(), false
	case !ok:
		return ctx, nil, nil, false
	}
	return ctx, leave, nil, true
}

// isPriority reports whether op is a mutation whose root fields (through
// fragments, __typename aside) are all priority fields, and at least one.
func isPriority(op *ast.OperationDefinition) bool {
	if op.Operation != ast.Mutation {
		return false
	}
	n, ok := priorityRootFields(op.SelectionSet, 0)
	return ok && n > 0
}

// priorityRootFields counts the root fields of set and reports whether all
// are priority fields; depth stops a fragment cycle the validation would
// have refused anyway.
func priorityRootFields(set ast.SelectionSet, depth int) (int, bool) {
	if depth > 8 {
		return 0, false
	}
	n := 0
	for _, s := range set {
		var sub ast.SelectionSet
		switch s := s.(type) {
		case *ast.Field:
			if strings.HasPrefix(s.Name, "__") {
				continue
			}
			if !priorityFields[s.Name] {
				return n, false
			}
			n++
			continue
		case *ast.InlineFragment:
			sub = s.SelectionSet
		case *ast.FragmentSpread:
			if s.Definition == nil {
				return n, false
			}
			sub = s.Definition.SelectionSet
		}
		m, ok := priorityRootFields(sub, depth+1)
		n += m
		if !ok {
			return n, false
		}
	}
	return n, true
}
