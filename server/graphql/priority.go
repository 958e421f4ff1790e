package graphql

import (
	"context"
	"runtime"
	"strings"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/prom"
)

// The gate's sizes (Limits.GateSlots, Limits.GateWait): eight slots per
// core the process runs on when it is turned on, and ten seconds.
const (
	GateSlotsPerCPU = 8
	DefaultGateWait = 10 * time.Second
)

// SuggestedGateSlots is GateSlotsPerCPU times GOMAXPROCS, the size to
// start from when the gate is turned on: the slots bound the goroutines
// that compete with a commit for each core. On two cores, 16: in the
// flash-sale rehearsal, 8 slots per process gave the storm's commits about
// half the latency 16 gave, but a quarter fewer answers per second than 16
// and a third fewer than no gate (docs/benchmarks.md). The gate is off
// unless asked for: an operation holds its slot while it waits too (a
// loader's gathering, the reserve batcher's run), so on a quiet machine 16
// slots cut stock queries at 50 connections to a third and the storm's
// answers by a third.
func SuggestedGateSlots() int { return GateSlotsPerCPU * runtime.GOMAXPROCS(0) }

// priorityFields are the mutations that are money, or give units back: an
// operation made of these only is never made to wait at the gate.
var priorityFields = map[string]bool{
	"commit": true, "commitCart": true, "cancel": true, "cancelCart": true,
}

// gate serves payments ahead of the crowd. In a flash sale most requests
// are reserves of a sold-out SKU and reads, and on a process with a few
// cores each one in flight is a goroutine waiting for the CPU: a commit,
// woken at each step (its body, Redis, PostgreSQL, its answer), waits in
// the run queue behind all of them. So every query and mutation that is not
// a priority operation takes one of slots before it executes and gives it
// back when its response is made; the rest wait, parked (not runnable), in
// the order they came, for at most wait (or until their client goes).
// Priority operations (mutations whose root fields are all in
// priorityFields) skip it. Subscriptions are not gated: they are streams,
// bounded by the stream caps.
//
// The gate sits after the operation is parsed and priced (its root fields
// are known; the parse is cached) and after the cost budget has spent, so
// that what waits is what will run.
type gate struct {
	slots chan struct{} // nil: the gate is off
	wait  time.Duration

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
			Help: "Operations waiting for a slot of the gate (not priority ones: those skip it).",
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
			Help:    "How long ordinary operations waited for a slot of the gate.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		})),
	}
	if slots > 0 {
		g.slots = make(chan struct{}, slots)
		prom.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dropline_graphql_gate_in_use",
			Help: "Slots of the gate held by ordinary operations running.",
		}, func() float64 { return float64(len(g.slots)) }))
		prom.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dropline_graphql_gate_slots",
			Help: "Slots of the gate (DROPLINE_GATE_SLOTS): ordinary operations that run at once.",
		}, func() float64 { return float64(cap(g.slots)) }))
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

// InterceptOperation lets a priority operation through at once and makes
// any other query or mutation take a slot for the making of its response.
// The slot is taken inside the response handler, where the fields are
// resolved, so it is held exactly while the operation executes.
func (g *gate) InterceptOperation(ctx context.Context, next gqlgen.OperationHandler) gqlgen.ResponseHandler {
	op := gqlgen.GetOperationContext(ctx)
	if g.slots == nil || op.Operation == nil || op.Operation.Operation == ast.Subscription {
		return next(ctx)
	}
	if isPriority(op.Operation) {
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
		if resp, ok := g.acquire(ctx); !ok {
			return resp
		}
		defer g.release()
		return responses(ctx)
	}
}

// acquire takes a slot, waiting in order behind those who came first, for
// at most g.wait. When it cannot, it returns the response to give: nil
// when the client is gone (the transport writes nothing), SERVER_BUSY when
// the wait was too long.
func (g *gate) acquire(ctx context.Context) (*gqlgen.Response, bool) {
	select {
	case g.slots <- struct{}{}:
		g.admitted.WithLabelValues(classOrdinary).Inc()
		g.waited.Observe(0)
		return nil, true
	default:
	}
	start := time.Now()
	g.waiting.Inc()
	defer g.waiting.Dec()
	timer := time.NewTimer(g.wait)
	defer timer.Stop()
	select {
	case g.slots <- struct{}{}:
		g.admitted.WithLabelValues(classOrdinary).Inc()
		g.waited.Observe(time.Since(start).Seconds())
		return nil, true
	case <-ctx.Done():
		g.refused.WithLabelValues("gone").Inc()
		return nil, false
	case <-timer.C:
		g.refused.WithLabelValues("timeout").Inc()
		return &gqlgen.Response{Errors: gqlerror.List{{
			Message:    "the server is busy: this operation waited " + g.wait.String() + " for its turn; retry in a second",
			Extensions: map[string]any{"code": CodeBusy, "retryAfterSeconds": 1},
		}}}, false
	}
}

func (g *gate) release() { <-g.slots }

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
