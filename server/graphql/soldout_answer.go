package graphql

import (
	"bytes"
	"context"
	"strings"
	"sync"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/resolvers"
)

// soldOutAnswers answers, in the HTTP transport, the refusal of a reserve
// the engine's sold-out memory decides (inventory.Engine.ReserveFromMemory)
// without executing the operation: during a storm of buyers asking for a
// sold-out SKU, gqlgen's execution of the mutation (a context, a field
// context and an interceptor chain per field, the payload built and
// marshaled through them) was most of what each refusal cost.
//
// It takes only an operation it can answer as gqlgen would, byte for byte,
// once gqlgen has parsed, validated and priced it (CreateOperationContext):
// a mutation whose fields collect (fragments, @skip and @include applied)
// to one reserve and nothing else, with an input of a sku and a quantity
// only (no idempotency key, whose refusal Redis records for replay, no
// admission pass, no hold length), selecting ReservePayload's and
// UserError's fields with nothing deferred, from a principal. Everything
// else, and every request the memory does not answer, runs as usual, as
// does every operation when tracing is on (its span is the operation's)
// or when the request registers a persisted query (which happens as the
// operation runs).
//
// What the operation's execution would have done besides is done here in
// its order: the cost is spent from the caller's budget (a refusal is left
// to the usual path, which refuses it the same way), a slot of the gate is
// taken (priority.go: a reserve waits as it would to execute, and may get
// SERVER_BUSY), the reserve spends the caller's mutation budget and counts
// its outcome in the engine, the fields resolved are the operation's
// actual cost, the rest is given back and the response carries its cost
// report.
type soldOutAnswers struct {
	res  *resolvers.Resolver
	cost queryCost
	gate *gate
	// plans are the collected fields of operations without directives,
	// which do not depend on the variables (soldOutPlans).
	plans soldOutPlans
	// answered counts the operations answered here.
	answered prometheus.Counter
}

func newSoldOutAnswers(res *resolvers.Resolver, reg prometheus.Registerer) *soldOutAnswers {
	return &soldOutAnswers{res: res, answered: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dropline_graphql_sold_out_answered_total",
		Help: "Reserves the sold-out memory refused that were answered without executing the operation.",
	}))}
}

// Bounds within which an answer's size is known to be far below the
// response's limit, whose check (queryCost) the answer does not make: a
// document of at most soldOutMaxQuery bytes, whose aliases are all the
// answer can repeat, and a limit of at least soldOutMinResponse.
const (
	soldOutMaxQuery    = 8 << 10
	soldOutMinResponse = 64 << 10
)

var (
	mutationType       = []string{"Mutation"}
	reservePayloadType = []string{"ReservePayload"}
	userErrorType      = []string{"UserError"}
)

// soldOutReserve is an operation soldOutAnswers may answer: its reserve's
// input and its plan.
type soldOutReserve struct {
	sku      string
	quantity int
	*soldOutPlan
}

// soldOutPlan is what the fields of an operation collect to: its reserve
// field, the payload's fields and the user error's; nil when it may not be
// answered by soldOutAnswers whatever its variables.
type soldOutPlan struct {
	field   gqlgen.CollectedField
	payload []gqlgen.CollectedField
	errors  []gqlgen.CollectedField // the userErrors field's selection
}

// soldOutPlans remembers the plans of the last few operations without
// directives (so without @skip or @include, through which alone the
// variables change what fields collect to), by their parsed definition:
// gqlgen's query cache hands every request of the same document the same
// one. Past soldOutPlansMax it starts over.
type soldOutPlans struct {
	mu sync.RWMutex
	m  map[*ast.OperationDefinition]*soldOutPlan
}

const soldOutPlansMax = 64

func (p *soldOutPlans) get(op *ast.OperationDefinition) (*soldOutPlan, bool) {
	p.mu.RLock()
	plan, ok := p.m[op]
	p.mu.RUnlock()
	return plan, ok
}

func (p *soldOutPlans) put(op *ast.OperationDefinition, plan *soldOutPlan) {
	p.mu.Lock()
	if p.m == nil || len(p.m) >= soldOutPlansMax {
		p.m = make(map[*ast.OperationDefinition]*soldOutPlan, soldOutPlansMax)
	}
	p.m[op] = plan
	p.mu.Unlock()
}

// answer answers opCtx when it can (see soldOutAnswers). answered is false
// when the operation must run as usual, and then nothing was spent; resp
// is nil when the client left while the operation waited at the gate
// (nothing is written then, as for an executed one).
func (s *soldOutAnswers) answer(ctx context.Context, opCtx *gqlgen.OperationContext) (resp *gqlgen.Response, answered bool) {
	if s == nil || s.cost.maxBytes < soldOutMinResponse {
		return nil, false
	}
	op, ok := s.operation(opCtx)
	if !ok || !s.res.KnownSoldOut(op.sku) {
		return nil, false
	}
	m := meterOf(opCtx)
	spent := false
	if m != nil && s.cost.budgets != nil {
		ok, st := s.cost.budgets.spend(m.key, m.requested)
		if !ok {
			return nil, false // refused by the usual path, as it would be
		}
		m.state, spent = st, true
	}
	if s.gate != nil && s.gate.slots != nil {
		if busy, ok := s.gate.acquire(ctx); !ok {
			return busy, true
		}
		defer s.gate.release()
	}
	payload, ok := s.res.ReserveFromMemory(ctx, op.sku, op.quantity)
	if !ok {
		if spent {
			m.state = s.cost.budgets.refund(m.key, m.requested)
		}
		return nil, false
	}
	s.answered.Inc()
	var b bytes.Buffer
	b.Grow(256 + len(opCtx.RawQuery))
	fields := op.write(&b, payload)
	resp = &gqlgen.Response{Data: b.Bytes()}
	if m != nil {
		m.fields.Add(int64(fields))
		if spent && m.refunded.CompareAndSwap(false, true) {
			m.state = s.cost.budgets.refund(m.key, m.requested-int(m.fields.Load()))
		}
		resp.Extensions = map[string]any{"cost": s.cost.report(m)}
	}
	return resp, true
}

// operation reads what answer needs of opCtx; false when it may not be
// answered here.
func (s *soldOutAnswers) operation(opCtx *gqlgen.OperationContext) (op soldOutReserve, ok bool) {
	if opCtx.Operation == nil || opCtx.Operation.Operation != ast.Mutation || len(opCtx.RawQuery) > soldOutMaxQuery {
		return op, false
	}
	if st, _ := opCtx.Stats.GetExtension(apqStats).(*extension.ApqStats); st != nil && st.SentQuery {
		return op, false
	}
	cacheable := !strings.Contains(opCtx.RawQuery, "@")
	plan, known := (*soldOutPlan)(nil), false
	if cacheable {
		plan, known = s.plans.get(opCtx.Operation)
	}
	if !known {
		plan = planSoldOut(opCtx)
		if cacheable {
			s.plans.put(opCtx.Operation, plan)
		}
	}
	if plan == nil {
		return op, false
	}
	op.soldOutPlan = plan
	if op.sku, op.quantity, ok = reserveInput(plan.field.ArgumentMap(opCtx.Variables)); !ok {
		return op, false
	}
	return op, true
}

// planSoldOut collects the fields of opCtx's operation into its plan; nil
// when soldOutAnswers may not answer it.
func planSoldOut(opCtx *gqlgen.OperationContext) *soldOutPlan {
	root := gqlgen.CollectFields(opCtx, opCtx.Operation.SelectionSet, mutationType)
	if len(root) != 1 || root[0].Name != "reserve" || len(root[0].Deferrables) > 0 {
		return nil
	}
	plan := &soldOutPlan{field: root[0]}
	plan.payload = gqlgen.CollectFields(opCtx, plan.field.Selections, reservePayloadType)
	for _, f := range plan.payload {
		if len(f.Deferrables) > 0 {
			return nil
		}
		switch f.Name {
		case "__typename", "reservation":
		case "userErrors":
			plan.errors = gqlgen.CollectFields(opCtx, f.Selections, userErrorType)
			for _, e := range plan.errors {
				if len(e.Deferrables) > 0 {
					return nil
				}
				switch e.Name {
				case "__typename", "code", "field", "message", "retryAfterSeconds", "available":
				default:
					return nil
				}
			}
		default:
			return nil
		}
	}
	return plan
}

// reserveInput reads reserve's arguments: an input of a string sku and an
// integer quantity, every other member absent or null.
func reserveInput(args map[string]any) (sku string, quantity int, ok bool) {
	if len(args) != 1 {
		return "", 0, false
	}
	in, _ := args["input"].(map[string]any)
	if in == nil {
		return "", 0, false
	}
	for k, v := range in {
		switch k {
		case "sku":
			if sku, ok = v.(string); !ok {
				return "", 0, false
			}
		case "quantity":
			q, err := gqlgen.UnmarshalInt32(v)
			if err != nil {
				return "", 0, false
			}
			quantity = int(q)
		default:
			if v != nil {
				return "", 0, false
			}
		}
	}
	return sku, quantity, sku != "" && quantity != 0
}

// write writes the data of op's answer, payload, as gqlgen's execution
// writes it, and returns how many fields it resolved (the operation's
// actual cost, __typename aside, as queryCost counts them).
func (op soldOutReserve) write(b *bytes.Buffer, payload *model.ReservePayload) (fields int) {
	b.WriteByte('{')
	gqlgen.MarshalString(op.field.Alias).MarshalGQL(b)
	b.WriteByte(':')
	fields++
	b.WriteByte('{')
	for i, f := range op.payload {
		if i > 0 {
			b.WriteByte(',')
		}
		gqlgen.MarshalString(f.Alias).MarshalGQL(b)
		b.WriteByte(':')
		switch f.Name {
		case "__typename":
			gqlgen.MarshalString("ReservePayload").MarshalGQL(b)
		case "reservation":
			fields++
			b.WriteString("null")
		case "userErrors":
			fields++
			b.WriteByte('[')
			for j, ue := range payload.UserErrors {
				if j > 0 {
					b.WriteByte(',')
				}
				fields += op.writeUserError(b, ue)
			}
			b.WriteByte(']')
		}
	}
	b.WriteString("}}")
	return fields
}

func (op soldOutReserve) writeUserError(b *bytes.Buffer, ue *model.UserError) (fields int) {
	b.WriteByte('{')
	for i, f := range op.errors {
		if i > 0 {
			b.WriteByte(',')
		}
		gqlgen.MarshalString(f.Alias).MarshalGQL(b)
		b.WriteByte(':')
		if f.Name != "__typename" {
			fields++
		}
		switch f.Name {
		case "__typename":
			gqlgen.MarshalString("UserError").MarshalGQL(b)
		case "code":
			ue.Code.MarshalGQL(b)
		case "field":
			if ue.Field == nil {
				b.WriteString("null")
				break
			}
			b.WriteByte('[')
			for j, s := range ue.Field {
				if j > 0 {
					b.WriteByte(',')
				}
				gqlgen.MarshalString(s).MarshalGQL(b)
			}
			b.WriteByte(']')
		case "message":
			gqlgen.MarshalString(ue.Message).MarshalGQL(b)
		case "retryAfterSeconds":
			writeOptionalInt(b, ue.RetryAfterSeconds)
		case "available":
			writeOptionalInt(b, ue.Available)
		}
	}
	b.WriteByte('}')
	return fields
}

func writeOptionalInt(b *bytes.Buffer, v *int) {
	if v == nil {
		b.WriteString("null")
		return
	}
	gqlgen.MarshalInt(*v).MarshalGQL(b)
}
