package graphql

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/resolvers"
)

// CodeResponseTooLarge refuses a response that grew past Limits.ResponseBytes.
const CodeResponseTooLarge = "RESPONSE_TOO_LARGE"

// costStats names an operation's costMeter in gqlgen's stats.
const costStats = "QueryCost"

// queryCost is what an operation costs, from before it runs to its
// response. Every query and mutation is priced (resolvers' list rule) and
// refused over the limit (COMPLEXITY_LIMIT_EXCEEDED) or over what its
// caller's budget holds (RATE_LIMITED), before any resolver runs; while it
// runs, each field resolved is counted (its actual cost, which the budget
// gets back the rest of) and the response's size is estimated, and once
// that passes maxBytes no further field is resolved and the response is
// RESPONSE_TOO_LARGE. Every response to a priced operation tells its cost
// in extensions.cost, in Shopify's shape; so does a refusal's error, which
// reaches websocket and SSE clients as it is (the HTTP transport adds the
// RateLimit headers). Subscriptions are priced against the limit only: a
// subscription is bounded by the stream caps, and its events by their
// selection.
type queryCost struct {
	price    complexityLimit
	budgets  *costBudgets // nil: no budgets
	maxBytes int64
	// refused counts refusals by reason: "cost_limit", "budget",
	// "response_size".
	refused *prometheus.CounterVec
}

func newCostRefusals(reg prometheus.Registerer) *prometheus.CounterVec {
	return prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dropline_graphql_cost_refused_total",
		Help: "Operations refused for their cost, by reason (cost_limit, budget, response_size).",
	}, []string{"reason"}))
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationContextMutator
	gqlgen.OperationInterceptor
	gqlgen.FieldInterceptor
	gqlgen.ResponseInterceptor
} = queryCost{}

// ExtensionName names the extension in gqlgen's stats.
func (queryCost) ExtensionName() string { return costStats }

// Validate hands the schema to the pricing.
func (c queryCost) Validate(es gqlgen.ExecutableSchema) error { return c.price.Validate(es) }

// costMeter is one operation's cost.
type costMeter struct {
	requested int
	// refused: over the limit or the budget; nothing ran.
	refused bool
	// budgets are the caller's (nil: none), key names its budget, and
	// state is what it held last.
	budgets *costBudgets
	key     budgetKey
	state   budgetState
	// fields counts the fields resolved: the actual cost. bytes is the
	// response's size so far, as estimated field by field; past the bound,
	// stopped.
	fields   atomic.Int64
	bytes    atomic.Int64
	stopped  atomic.Bool
	refunded atomic.Bool
	// report is what extensions.cost says, made once the cost is known.
	report costReport
}

func meterOf(op *gqlgen.OperationContext) *costMeter {
	m, _ := op.Stats.GetExtension(costStats).(*costMeter)
	return m
}

// MutateOperationContext prices the operation, and refuses it over the
// limit.
func (c queryCost) MutateOperationContext(ctx context.Context, op *gqlgen.OperationContext) *gqlerror.Error {
	overLimit := c.price.MutateOperationContext(ctx, op)
	stats, _ := op.Stats.GetExtension(c.price.ExtensionName()).(*extension.ComplexityStats)
	if stats == nil {
		return overLimit // not priced: no operation by that name
	}
	m := &costMeter{requested: stats.Complexity, budgets: c.budgets, key: budgetKeyOf(ctx)}
	if overLimit != nil {
		m.refused = true
		if c.budgets != nil {
			m.state = c.budgets.peek(m.key)
		}
		overLimit.Extensions["cost"] = c.report(m)
		c.refused.WithLabelValues("cost_limit").Inc()
		op.Stats.SetExtension(costStats, m)
		return overLimit
	}
	// A subscription's events are bounded by its price each; they spend
	// nothing and are not metered (a meter would add them up).
	if op.Operation.Operation != ast.Subscription {
		op.Stats.SetExtension(costStats, m)
	}
	return nil
}

// InterceptOperation spends the operation's price from its caller's
// budget, or refuses it. It is here, when the operation is dispatched, and
// not with the pricing, because a transport may create an operation more
// than once to look at it (an SSE request is looked at for a shared
// subscription first): only the one that runs spends.
func (c queryCost) InterceptOperation(ctx context.Context, next gqlgen.OperationHandler) gqlgen.ResponseHandler {
	op := gqlgen.GetOperationContext(ctx)
	m := meterOf(op)
	if m == nil || c.budgets == nil {
		return next(ctx)
	}
	ok, st := c.budgets.spend(m.key, m.requested)
	m.state = st
	if ok {
		return next(ctx)
	}
	m.refused = true
	c.refused.WithLabelValues("budget").Inc()
	secs := m.retryAfterSeconds()
	report := c.report(m)
	return gqlgen.OneShot(&gqlgen.Response{
		Errors: gqlerror.List{{
			Message: fmt.Sprintf("this operation costs %d and the caller's budget holds %d: retry in %d s",
				m.requested, int(m.state.Available), secs),
			Extensions: map[string]any{
				"code":              resolvers.CodeRateLimited,
				"retryAfterSeconds": secs,
				"cost":              report,
				"rateLimit":         c.budgets.rateLimit(m.state),
				"rateLimitPolicy":   c.budgets.policy[0],
			},
		}},
		Extensions: map[string]any{"cost": report},
	})
}

// InterceptField counts each field resolved and its share of the
// response, and resolves nothing more once the response is too large.
func (c queryCost) InterceptField(ctx context.Context, next gqlgen.Resolver) (any, error) {
	m := meterOf(gqlgen.GetOperationContext(ctx))
	if m == nil {
		return next(ctx)
	}
	if m.stopped.Load() {
		return nil, responseTooLarge(c.maxBytes)
	}
	res, err := next(ctx)
	fc := gqlgen.GetFieldContext(ctx)
	if !strings.HasPrefix(fc.Field.Name, "__") && !strings.HasPrefix(fc.Object, "__") {
		m.fields.Add(1) // introspection is priced at nothing
	}
	if m.bytes.Add(int64(len(fc.Field.Alias)+4+valueBytes(res))) > c.maxBytes {
		m.stopped.Store(true)
		return nil, responseTooLarge(c.maxBytes)
	}
	return res, err
}

// InterceptResponse refuses a response past the bound, gives the budget
// back what the operation did not use, and tells the client its cost.
func (c queryCost) InterceptResponse(ctx context.Context, next gqlgen.ResponseHandler) *gqlgen.Response {
	if !gqlgen.HasOperationContext(ctx) {
		return next(ctx)
	}
	m := meterOf(gqlgen.GetOperationContext(ctx))
	if m == nil {
		return next(ctx)
	}
	resp := next(ctx)
	if resp == nil {
		return nil
	}
	if !m.refused {
		if m.stopped.Load() || int64(len(resp.Data)) > c.maxBytes {
			m.stopped.Store(true)
			c.refused.WithLabelValues("response_size").Inc()
			resp.Data = []byte("null")
			resp.Errors = gqlerror.List{responseTooLarge(c.maxBytes)}
		}
		if c.budgets != nil && m.refunded.CompareAndSwap(false, true) {
			m.state = c.budgets.refund(m.key, m.requested-int(m.fields.Load()))
		}
	}
	if resp.Extensions == nil {
		resp.Extensions = make(map[string]any, 1)
	}
	resp.Extensions["cost"] = c.report(m)
	return resp
}

func responseTooLarge(maxBytes int64) *gqlerror.Error {
	return &gqlerror.Error{
		Message:    fmt.Sprintf("the response would be larger than %d bytes: ask for fewer items or fields", maxBytes),
		Extensions: map[string]any{"code": CodeResponseTooLarge, "limit": maxBytes},
	}
}

// costReport is extensions.cost, in Shopify's shape:
//
//	{"requestedQueryCost": 202, "actualQueryCost": 32, "throttleStatus":
//	  {"maximumAvailable": 10000, "currentlyAvailable": 9968, "restoreRate": 1000}}
//
// actualQueryCost is null for an operation that did not run; throttleStatus
// is absent when there are no budgets.
type costReport struct {
	requested, actual int
	ran               bool
	budgets           bool
	maximum, current  int
	rate              int
}

// report fills m's report with what is known now; every response carries
// it, so it lives in the meter rather than in an allocation of its own.
func (c queryCost) report(m *costMeter) *costReport {
	r := &m.report
	*r = costReport{requested: m.requested, ran: !m.refused, actual: int(m.fields.Load())}
	if c.budgets != nil {
		r.budgets, r.maximum, r.current, r.rate = true, int(c.budgets.burst), int(m.state.Available), int(c.budgets.rate)
	}
	return r
}

// costReportBytes is room for a report's JSON.
const costReportBytes = 160

// MarshalJSON writes the report without encoding/json's reflection: every
// response carries one.
func (r *costReport) MarshalJSON() ([]byte, error) {
	return r.appendJSON(make([]byte, 0, costReportBytes)), nil
}

func (r *costReport) appendJSON(b []byte) []byte {
	b = strconv.AppendInt(append(b, `{"requestedQueryCost":`...), int64(r.requested), 10)
	b = append(b, `,"actualQueryCost":`...)
	if r.ran {
		b = strconv.AppendInt(b, int64(r.actual), 10)
	} else {
		b = append(b, "null"...)
	}
	if r.budgets {
		b = strconv.AppendInt(append(b, `,"throttleStatus":{"maximumAvailable":`...), int64(r.maximum), 10)
		b = strconv.AppendInt(append(b, `,"currentlyAvailable":`...), int64(r.current), 10)
		b = strconv.AppendInt(append(b, `,"restoreRate":`...), int64(r.rate), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

func (m *costMeter) retryAfterSeconds() int {
	return max(1, int(math.Ceil(m.state.RetryAfter.Seconds())))
}

// throttled reports whether the caller's budget refused the operation.
func (m *costMeter) throttled() bool { return m.refused && m.state.RetryAfter > 0 }

// writeHeaders sets the RateLimit fields of an HTTP response (and
// Retry-After when the budget refused the operation); false when there
// are no budgets.
func (m *costMeter) writeHeaders(h http.Header) bool {
	if m.budgets == nil {
		return false
	}
	h["Ratelimit-Policy"] = m.budgets.policy
	h["Ratelimit"] = []string{m.budgets.rateLimit(m.state)}
	if m.throttled() {
		h["Retry-After"] = []string{strconv.Itoa(m.retryAfterSeconds())}
	}
	return true
}

// valueBytes estimates what a field's value adds to the response: exactly
// for numbers, booleans, null and strings without escapes, the brackets of
// an object or a list (its items add their own). The encoded response is
// measured too, once built, so an estimate that falls short (escapes) is
// still refused; the estimate only makes building stop early.
func valueBytes(v any) int {
	switch v := v.(type) {
	case nil:
		return 4
	case string:
		return len(v) + 2
	case bool:
		return 5
	case int:
		return len(strconv.Itoa(v))
	case int64:
		return len(strconv.FormatInt(v, 10))
	case time.Time:
		return len(time.RFC3339Nano) + 2
	case *time.Time:
		if v == nil {
			return 4
		}
		return len(time.RFC3339Nano) + 2
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return 4
		}
		if rv.Elem().Kind() == reflect.Struct {
			return 2 // an object
		}
		return valueBytes(rv.Elem().Interface())
	case reflect.String:
		return rv.Len() + 2
	case reflect.Slice, reflect.Array:
		return 2 + rv.Len()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return 20
	}
	return 2 // an object
}
