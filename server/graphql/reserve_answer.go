package graphql

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/resolvers"
)

// reserveAnswers answers, in the HTTP transport, the reserves it can
// without executing the operation: the refusal the engine's sold-out memory
// decides (inventory.Engine.ReserveFromMemory), and any other reserve of the
// same shape whose payload it can write, by calling the reserve mutation's
// resolver itself. gqlgen's execution of the mutation (a context, a field
// context and an interceptor chain per field, the payload built and
// marshaled through them) was most of what each refusal cost, during a
// storm of buyers asking for a sold-out SKU, and a fifth of a hold's cost.
//
// It takes only an operation it can answer as gqlgen would, byte for byte,
// once gqlgen has parsed, validated and priced it (CreateOperationContext):
// a mutation whose fields collect (fragments, @skip and @include applied)
// to one reserve and nothing else, with an input of a sku, a quantity,
// and an idempotency key and a hold length when given (no admission
// pass), selecting ReservePayload's and UserError's fields with nothing
// deferred, from a principal. The memory answers only a reserve of a sku
// and a quantity alone (a key's refusal Redis records for replay, and a
// hold length is checked by the engine). A reserve the memory does not
// answer is answered here when the reservation's
// selection asks for none of its fields with a resolver of their own
// (product) and nothing deferred; the resolver's error or panic is answered
// as execution answers it (the error presenter's error on the field's
// path, data null). Everything else, and every request the memory does not
// answer, runs as usual, as does every operation when tracing is on (its
// span is the operation's) or when the request registers a persisted query
// (which happens as the operation runs).
//
// What the operation's execution would have done besides is done here in
// its order: the cost is spent from the caller's budget (a refusal is left
// to the usual path, which refuses it the same way), a slot of the gate is
// taken (priority.go: a reserve waits as it would to execute, and may get
// SERVER_BUSY), the reserve spends the caller's mutation budget and counts
// its outcome in the engine, the fields resolved are the operation's
// actual cost, the rest is given back and the response carries its cost
// report.
type reserveAnswers struct {
	res  *resolvers.Resolver
	cost queryCost
	gate *gate
	// plans are the collected fields of operations without directives,
	// which do not depend on the variables (reservePlans).
	plans reservePlans
	// presenter is the error presenter execution uses, for a reserve
	// whose resolver fails.
	presenter gqlgen.ErrorPresenterFunc
	// answered counts the operations the memory answered here, held those
	// whose resolver ran here.
	answered, held prometheus.Counter
}

func newReserveAnswers(res *resolvers.Resolver, reg prometheus.Registerer) *reserveAnswers {
	return &reserveAnswers{res: res, presenter: res.ErrorPresenter(),
		answered: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_graphql_sold_out_answered_total",
			Help: "Reserves the sold-out memory refused that were answered without executing the operation.",
		})),
		held: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_graphql_reserve_answered_total",
			Help: "Reserves whose resolver was called and answered in the HTTP transport without executing the operation.",
		}))}
}

// Bounds within which an answer's size is known to be far below the
// response's limit, whose check (queryCost) the answer does not make: a
// document of at most answerMaxQuery bytes, whose aliases are all the
// answer can repeat, and a limit of at least answerMinResponse.
const (
	answerMaxQuery    = 8 << 10
	answerMinResponse = 64 << 10
)

var (
	mutationType       = []string{"Mutation"}
	reservePayloadType = []string{"ReservePayload"}
	userErrorType      = []string{"UserError"}
	// reservationType is what a Reservation's selection collects on, as
	// the generated code collects it (its interfaces included).
	reservationType = []string{"Reservation", "Node", "_Entity"}
)

// plainReserve is an operation reserveAnswers may answer: its reserve's
// input and its plan.
type plainReserve struct {
	sku      string
	quantity int
	// key and hold are the input's idempotencyKey and holdSeconds, nil
	// when absent or null.
	key  *string
	hold *int
	*reservePlan
}

// plain reports whether op asks for nothing but a sku and a quantity: the
// reserves the sold-out memory may answer.
func (op plainReserve) plain() bool { return op.key == nil && op.hold == nil }

// reservePlan is what the fields of an operation collect to: its reserve
// field, the payload's fields and the user error's; nil when it may not be
// answered by reserveAnswers whatever its variables.
type reservePlan struct {
	field   gqlgen.CollectedField
	payload []gqlgen.CollectedField
	errors  []gqlgen.CollectedField // the userErrors field's selection
	// reservation is the reservation field's selection; held is true when
	// writeReservation can write every field of it (all but product), so
	// that a reserve the memory does not answer may be answered too.
	reservation []gqlgen.CollectedField
	held        bool
	// inputVar is the variable the reserve's one argument is when it is
	// written input: $inputVar (ArgumentMap would give that variable's
	// value as it is); "" for any other argument list.
	inputVar string
}

// reservePlans remembers the plans of the last few operations without
// directives (so without @skip or @include, through which alone the
// variables change what fields collect to), by their parsed definition:
// gqlgen's query cache hands every request of the same document the same
// one. Past reservePlansMax it starts over.
type reservePlans struct {
	mu sync.RWMutex
	m  map[*ast.OperationDefinition]*reservePlan
}

const reservePlansMax = 64

func (p *reservePlans) get(op *ast.OperationDefinition) (*reservePlan, bool) {
	p.mu.RLock()
	plan, ok := p.m[op]
	p.mu.RUnlock()
	return plan, ok
}

func (p *reservePlans) put(op *ast.OperationDefinition, plan *reservePlan) {
	p.mu.Lock()
	if p.m == nil || len(p.m) >= reservePlansMax {
		p.m = make(map[*ast.OperationDefinition]*reservePlan, reservePlansMax)
	}
	p.m[op] = plan
	p.mu.Unlock()
}

// reserveAnswer is what reserveAnswers.answer answers: the response, its
// cost report (nil without a meter), which the transport writes as the
// response's cost extension, and the buffer the response's data is in
// (nil when it is in none of responseBuffers), given back by release once
// the response is written.
type reserveAnswer struct {
	resp *gqlgen.Response
	cost *costReport
	buf  *bytes.Buffer
}

// release gives a's buffer back to responseBuffers: a.resp's data is not
// to be read again.
func (a reserveAnswer) release() {
	if a.buf != nil {
		responseBuffers.put(a.buf)
	}
}

// answer answers opCtx when it can (see reserveAnswers). answered is false
// when the operation must run as usual, and then nothing was spent; a.resp
// is nil when the client left while the operation waited at the gate, or
// before its reserve ran (nothing is written then, as for an executed one).
func (s *reserveAnswers) answer(ctx context.Context, opCtx *gqlgen.OperationContext) (a reserveAnswer, answered bool) {
	if s == nil || s.cost.maxBytes < answerMinResponse {
		return a, false
	}
	op, ok := s.operation(opCtx)
	if !ok {
		return a, false
	}
	soldOut := op.plain() && s.res.KnownSoldOut(op.sku)
	if !soldOut && !op.held {
		return a, false
	}
	m := meterOf(opCtx)
	spent := false
	if m != nil && s.cost.budgets != nil {
		ok, st := s.cost.budgets.spend(m.key, m.requested)
		if !ok {
			return a, false // refused by the usual path, as it would be
		}
		m.state, spent = st, true
	}
	if s.gate != nil && s.gate.cpu != nil {
		var leave func()
		var busy *gqlgen.Response
		if ctx, leave, busy, ok = s.gate.admit(ctx); !ok {
			return reserveAnswer{resp: busy}, true
		}
		defer leave()
	}
	var payload *model.ReservePayload
	fromMemory := false
	if soldOut {
		payload, fromMemory = s.res.ReserveFromMemory(ctx, op.sku, op.quantity)
	}
	if !fromMemory {
		if !op.held {
			if spent {
				m.state = s.cost.budgets.refund(m.key, m.requested)
			}
			return a, false
		}
		if ctx.Err() != nil {
			// Execution answers nothing once the client has left.
			return a, true
		}
		var failed *gqlgen.Response
		var fields int
		if payload, failed, fields = s.reserve(ctx, opCtx, op); failed != nil {
			s.held.Inc()
			return s.finish(m, spent, reserveAnswer{resp: failed}, fields), true
		}
		s.held.Inc()
	} else {
		s.answered.Inc()
	}
	b := responseBuffers.get()
	fields, errs := op.write(ctx, b, payload, s.presenter, opCtx)
	return s.finish(m, spent, reserveAnswer{resp: &gqlgen.Response{Data: b.Bytes(), Errors: errs}, buf: b}, fields), true
}

// finish counts the fields an answer resolved as the operation's actual
// cost, gives the rest of the budget back and adds the cost report, as
// queryCost does for an executed operation.
func (s *reserveAnswers) finish(m *costMeter, spent bool, a reserveAnswer, fields int) reserveAnswer {
	if m == nil {
		return a
	}
	m.fields.Add(int64(fields))
	if spent && m.refunded.CompareAndSwap(false, true) {
		m.state = s.cost.budgets.refund(m.key, m.requested-int(m.fields.Load()))
	}
	a.cost = s.cost.report(m)
	return a
}

// reserve runs the reserve mutation's resolver for op. When it fails (an
// error, a panic) failed is the response execution makes of it: the error
// as gqlgen adds it on the field's path, and no data (the payload is
// non-null, so the mutation's data is null).
// fields is what the failure resolved: the reserve field, unless it
// panicked.
func (s *reserveAnswers) reserve(ctx context.Context, opCtx *gqlgen.OperationContext, op plainReserve) (payload *model.ReservePayload, failed *gqlgen.Response, fields int) {
	in := model.ReserveInput{Sku: op.sku, Quantity: op.quantity, IdempotencyKey: op.key, HoldSeconds: op.hold}
	var err error
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		payload, err = s.res.Mutation().Reserve(ctx, in)
	}()
	if recovered == nil && err == nil && payload != nil {
		return payload, nil, 0
	}
	// The contexts execution would have made, for the error presenter
	// and the error's path and location.
	ctx = gqlgen.WithResponseContext(gqlgen.WithOperationContext(ctx, opCtx), s.presenter, opCtx.RecoverFunc)
	ctx = gqlgen.WithFieldContext(ctx, &gqlgen.FieldContext{Object: "Mutation"})
	ctx = gqlgen.WithFieldContext(ctx, &gqlgen.FieldContext{Object: "Mutation", Field: op.field, Args: map[string]any{"input": in},
		IsMethod: true, IsResolver: true})
	fields = 1
	switch {
	case recovered != nil:
		fields = 0 // queryCost counts a field once its resolver returns
		opCtx.Error(ctx, opCtx.Recover(ctx, recovered))
	case err != nil:
		opCtx.Error(ctx, gqlgen.AddFieldLocationToError(ctx, err))
	default:
		gqlgen.AddInvalidNullError(ctx, "")
	}
	return nil, &gqlgen.Response{Data: []byte("null"), Errors: gqlgen.GetErrors(ctx)}, fields
}

// operation reads what answer needs of opCtx; false when it may not be
// answered here.
func (s *reserveAnswers) operation(opCtx *gqlgen.OperationContext) (op plainReserve, ok bool) {
	if opCtx.Operation == nil || opCtx.Operation.Operation != ast.Mutation || len(opCtx.RawQuery) > answerMaxQuery {
		return op, false
	}
	if st, _ := opCtx.Stats.GetExtension(apqStats).(*extension.ApqStats); st != nil && st.SentQuery {
		return op, false
	}
	cacheable := !strings.Contains(opCtx.RawQuery, "@")
	plan, known := (*reservePlan)(nil), false
	if cacheable {
		plan, known = s.plans.get(opCtx.Operation)
	}
	if !known {
		plan = planReserve(opCtx)
		if cacheable {
			s.plans.put(opCtx.Operation, plan)
		}
	}
	if plan == nil {
		return op, false
	}
	op.reservePlan = plan
	if plan.inputVar != "" {
		in, given := opCtx.Variables[plan.inputVar]
		if !given {
			return op, false // ArgumentMap leaves input out: no argument
		}
		ok = op.readInput(in)
	} else {
		ok = op.readArguments(plan.field.ArgumentMap(opCtx.Variables))
	}
	if !ok {
		return op, false
	}
	return op, true
}

// argumentVariable is the variable field's arguments are when they are
// exactly input: $variable, and input is the one argument the field takes,
// without a default: ArgumentMap then maps input to the variable's value,
// when the variable is given, and to nothing otherwise.
func argumentVariable(field gqlgen.CollectedField) string {
	if len(field.Arguments) != 1 || field.Definition == nil || len(field.Definition.Arguments) != 1 {
		return ""
	}
	arg, def := field.Arguments[0], field.Definition.Arguments[0]
	if arg.Name != "input" || def.Name != "input" || def.DefaultValue != nil || arg.Value == nil || arg.Value.Kind != ast.Variable {
		return ""
	}
	return arg.Value.Raw
}

// planReserve collects the fields of opCtx's operation into its plan; nil
// when reserveAnswers may not answer it.
func planReserve(opCtx *gqlgen.OperationContext) *reservePlan {
	root := gqlgen.CollectFields(opCtx, opCtx.Operation.SelectionSet, mutationType)
	if len(root) != 1 || root[0].Name != "reserve" || len(root[0].Deferrables) > 0 {
		return nil
	}
	plan := &reservePlan{field: root[0], held: true, inputVar: argumentVariable(root[0])}
	plan.payload = gqlgen.CollectFields(opCtx, plan.field.Selections, reservePayloadType)
	for _, f := range plan.payload {
		if len(f.Deferrables) > 0 {
			return nil
		}
		switch f.Name {
		case "__typename":
		case "reservation":
			plan.reservation = gqlgen.CollectFields(opCtx, f.Selections, reservationType)
			for _, r := range plan.reservation {
				switch r.Name {
				case "__typename", "id", "token", "sku", "quantity", "status", "expiresAt", "createdAt", "committedAt", "extensions":
				default:
					plan.held = false // product: a resolver of its own
				}
				if len(r.Deferrables) > 0 {
					plan.held = false
				}
			}
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

// readArguments reads reserve's arguments, args, into op: its one argument,
// input (readInput).
func (op *plainReserve) readArguments(args map[string]any) bool {
	if len(args) != 1 {
		return false
	}
	return op.readInput(args["input"])
}

// readInput reads reserve's input argument, v, into op, as execution
// would unmarshal it into a model.ReserveInput: a sku and a quantity, and
// an idempotency key and a hold length when given; false for anything
// else (an admission pass, a value execution would refuse).
func (op *plainReserve) readInput(v any) bool {
	in, _ := v.(map[string]any)
	if in == nil {
		return false
	}
	for k, v := range in {
		switch k {
		case "sku":
			sku, ok := v.(string)
			if !ok {
				return false
			}
			op.sku = sku
		case "quantity":
			q, err := gqlgen.UnmarshalInt32(v)
			if err != nil {
				return false
			}
			op.quantity = int(q)
		case "idempotencyKey":
			if v == nil {
				continue
			}
			key, ok := v.(string)
			if !ok {
				return false
			}
			op.key = &key
		case "holdSeconds":
			if v == nil {
				continue
			}
			h, err := gqlgen.UnmarshalInt32(v)
			if err != nil {
				return false
			}
			hold := int(h)
			op.hold = &hold
		default:
			if v != nil {
				return false
			}
		}
	}
	return op.sku != "" && op.quantity != 0
}

// write writes the data of op's answer, payload, as gqlgen's execution
// writes it, and returns how many fields it resolved (the operation's
// actual cost, __typename aside, as queryCost counts them) and the errors
// execution would add (none but for a hold without its times).
// ctx, presenter and opCtx are only for those errors.
func (op plainReserve) write(ctx context.Context, b *bytes.Buffer, payload *model.ReservePayload,
	presenter gqlgen.ErrorPresenterFunc, opCtx *gqlgen.OperationContext,
) (fields int, errs gqlerror.List) {
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
			if payload.Reservation == nil {
				b.WriteString("null")
				break
			}
			if missing := op.missingTimes(payload.Reservation); len(missing) > 0 {
				fields += op.reservationFields()
				errs = op.invalidNulls(gqlgen.WithResponseContext(gqlgen.WithOperationContext(ctx, opCtx), presenter, opCtx.RecoverFunc), f, missing)
				b.WriteString("null")
				break
			}
			fields += op.writeReservation(b, payload.Reservation)
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
	return fields, errs
}

// reservationFields is how many fields of the reservation's selection
// queryCost counts.
func (op plainReserve) reservationFields() (n int) {
	for _, f := range op.reservation {
		if f.Name != "__typename" {
			n++
		}
	}
	return n
}

// writeReservation writes r as execution writes it (every time field
// that must not be null is set: missingTimes).
func (op plainReserve) writeReservation(b *bytes.Buffer, r *model.Reservation) (fields int) {
	return writeObject(b, op.reservation, "Reservation", func(b *bytes.Buffer, name string) {
		switch name {
		case "id":
			gqlgen.MarshalString(r.ID).MarshalGQL(b)
		case "token":
			gqlgen.MarshalString(r.Token).MarshalGQL(b)
		case "sku":
			gqlgen.MarshalString(r.Sku).MarshalGQL(b)
		case "quantity":
			gqlgen.MarshalInt(r.Quantity).MarshalGQL(b)
		case "status":
			if st := string(r.Status); enumName(st) {
				writeEnumName(b, st)
			} else {
				r.Status.MarshalGQL(b)
			}
		case "expiresAt":
			writeTime(b, r.ExpiresAt)
		case "createdAt":
			writeTime(b, r.CreatedAt)
		case "committedAt":
			if r.CommittedAt == nil || r.CommittedAt.IsZero() {
				b.WriteString("null")
				return
			}
			writeTime(b, *r.CommittedAt)
		case "extensions":
			gqlgen.MarshalInt(r.Extensions).MarshalGQL(b)
		}
	})
}

// writeObject writes an object of typename whose selection is fields:
// each field's alias, then __typename's value or what value writes for
// the field's name. It returns how many fields it resolved (all but
// __typename, as queryCost counts them).
func writeObject(b *bytes.Buffer, fields []gqlgen.CollectedField, typename string, value func(b *bytes.Buffer, name string)) (n int) {
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		gqlgen.MarshalString(f.Alias).MarshalGQL(b)
		b.WriteByte(':')
		if f.Name == "__typename" {
			gqlgen.MarshalString(typename).MarshalGQL(b)
			continue
		}
		n++
		value(b, f.Name)
	}
	b.WriteByte('}')
	return n
}

// writeTime writes t as gqlgen.MarshalTime does (RFC 3339 with
// nanoseconds, which strconv.Quote leaves as it is), without its closure.
func writeTime(b *bytes.Buffer, t time.Time) {
	var buf [64]byte
	b.WriteByte('"')
	b.Write(t.AppendFormat(buf[:0], time.RFC3339Nano))
	b.WriteByte('"')
}

// missingTimes lists the selected fields of r that must not be null and
// that gqlgen.MarshalTime would make null (a zero time).
func (op plainReserve) missingTimes(r *model.Reservation) (missing []gqlgen.CollectedField) {
	for _, f := range op.reservation {
		if f.Name == "expiresAt" && r.ExpiresAt.IsZero() || f.Name == "createdAt" && r.CreatedAt.IsZero() {
			missing = append(missing, f)
		}
	}
	return missing
}

// invalidNulls are the errors execution adds for missing, each on its
// field's path, the reservation (nullable) being null then; ctx carries
// the response context execution would.
func (op plainReserve) invalidNulls(ctx context.Context, reservation gqlgen.CollectedField, missing []gqlgen.CollectedField) gqlerror.List {
	ctx = gqlgen.WithFieldContext(ctx, &gqlgen.FieldContext{Object: "Mutation"})
	ctx = gqlgen.WithFieldContext(ctx, &gqlgen.FieldContext{Object: "Mutation", Field: op.field, IsMethod: true, IsResolver: true})
	ctx = gqlgen.WithFieldContext(ctx, &gqlgen.FieldContext{Object: "ReservePayload", Field: reservation})
	for _, f := range missing {
		fc, _ := gqlgen.NewScalarFieldContext("Reservation", f, false, false, "Time")
		gqlgen.AddInvalidNullFromMarshaler(gqlgen.WithFieldContext(ctx, fc), "Time!")
	}
	return gqlgen.GetErrors(ctx)
}

func (op plainReserve) writeUserError(b *bytes.Buffer, ue *model.UserError) (fields int) {
	return writeObject(b, op.errors, "UserError", func(b *bytes.Buffer, name string) {
		switch name {
		case "code":
			if c := string(ue.Code); enumName(c) {
				writeEnumName(b, c)
			} else {
				ue.Code.MarshalGQL(b)
			}
		case "field":
			if ue.Field == nil {
				b.WriteString("null")
				return
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
	})
}

// enumName reports whether v is a GraphQL name ([_A-Za-z][_0-9A-Za-z]*),
// as every enum value is: one that strconv.Quote, which the generated
// MarshalGQL of an enum writes, leaves as it is between its quotes.
func enumName(v string) bool {
	if v == "" || v[0] >= '0' && v[0] <= '9' {
		return false
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// writeEnumName writes an enum value whose name is an enumName as its
// generated MarshalGQL does, without the fmt call and the quoted copy.
func writeEnumName(b *bytes.Buffer, name string) {
	b.WriteByte('"')
	b.WriteString(name)
	b.WriteByte('"')
}

func writeOptionalInt(b *bytes.Buffer, v *int) {
	if v == nil {
		b.WriteString("null")
		return
	}
	gqlgen.MarshalInt(*v).MarshalGQL(b)
}
