package graphql

import (
	"context"
	"net/http"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/vektah/gqlparser/v2/ast"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/resolvers"
)

// Config is what NewHandler needs. Engine, Redis and Verifier are required;
// every limit has a default for its zero value.
type Config struct {
	// Engine answers every query and mutation. Required.
	Engine *inventory.Engine
	// Redis stores persisted queries, under the engine's key prefix.
	// Required.
	Redis redis.UniversalClient
	// Verifier checks bearer tokens; NewHandler applies auth.Middleware with
	// it, so the handler is safe to mount anywhere: a request whose
	// Authorization header does not verify is answered 401 UNAUTHENTICATED
	// before anything else runs. Required.
	Verifier auth.Verifier
	// QueueSecret signs the admission queues' proof-of-work challenges,
	// shared by every instance (app derives it from the JWT secret). Nil:
	// a random one per process.
	QueueSecret []byte
	// Dev enables introspection and "did you mean" suggestions, which
	// otherwise help an attacker map the schema. Default: false.
	Dev bool
	// CORSOrigins lists the browser origins ("scheme://host[:port]") that
	// may call the API from another origin; "*" allows any. Requests
	// without an Origin header and same-origin requests are always served.
	// Default: empty, meaning same-origin only.
	CORSOrigins []string
	// Limits bound what one request may cost.
	Limits Limits
	// Now is the clock of the rate limiter's retry hints; default time.Now.
	Now func() time.Time
	// Live fans stock changes out to subscriptions. Nil leaves the
	// Subscription fields answering UNAVAILABLE (queries and mutations
	// still work). The caller starts and stops it.
	Live *live.Hub
	// Streams bound websocket and SSE connections and their subscriptions.
	Streams StreamLimits
	// Registerer receives the subscription transport's metrics. Nil: not
	// exported.
	Registerer prometheus.Registerer
	// TrustedDocuments, when set, are the only documents that run, named
	// by their id, and automatic persisted queries are off (trustedOnly).
	// Nil: any document runs, and APQ registers them.
	TrustedDocuments *TrustedDocuments
	// Tracer, when set, gives every query and mutation (and each event of
	// a subscription) a span (operationTracer). Nil: tracing off, no span.
	Tracer trace.TracerProvider
	// Subgraph serves Apollo Federation's _service and _entities, for a
	// gateway that composes Dropline into a supergraph. Default: false,
	// and both are refused with SUBGRAPH_DISABLED.
	Subgraph bool
}

// Limits protect the service from expensive or abusive requests. Each zero
// value takes the default named on the field.
type Limits struct {
	// Complexity caps an operation's cost: one per field, and a list's
	// selection times the most items the list can return (resolvers'
	// complexity.go). Default DefaultComplexity.
	Complexity int
	// CostRate and CostBurst are each caller's budget of cost points (one
	// per signed-in principal, one per client address for anonymous
	// requests, per process): it holds up to CostBurst points and gets
	// CostRate back per second. Every query and mutation spends its cost
	// before it runs and gets back what it did not use. Defaults
	// DefaultCostRate and DefaultCostBurst; a negative CostRate turns the
	// budgets off. CostBurst must be at least Complexity.
	CostRate  int
	CostBurst int
	// ResponseBytes bounds the size of one response: one growing past it
	// stops being built and is answered RESPONSE_TOO_LARGE. Default
	// DefaultResponseBytes.
	ResponseBytes int64
	// Depth caps how deeply fields nest (introspection fields excluded).
	// Default 10.
	Depth int
	// RootMutationFields caps the mutations in one operation, so aliasing
	// one mutation many times cannot bypass the rate limit. Default 10.
	RootMutationFields int
	// BodyBytes caps a request body; larger ones get 413. Default 1 MiB.
	BodyBytes int64
	// ParserTokens caps the tokens the query parser reads. Default 15000.
	ParserTokens int
	// QueryCache is how many parsed documents are kept (LRU). Default 1000.
	QueryCache int
	// PageSize is the default `first` of connections; MaxPageSize the
	// largest allowed (requests above get INVALID_INPUT). Defaults 20, 100.
	PageSize    int
	MaxPageSize int
	// MutationRate and MutationBurst define the per-principal mutation
	// limit (GCRA): MutationRate per MutationPeriod on average, bursts of
	// up to MutationBurst (a cart spends one unit per line). Defaults
	// resolvers.DefaultMutationRate per second, and a burst of twice the
	// rate, at least the largest cart. A negative MutationRate disables the
	// limit.
	MutationRate   int
	MutationPeriod time.Duration
	MutationBurst  int
	// APQTTL is how long a persisted query is kept in Redis. Default 24 h.
	APQTTL time.Duration
	// APQQueryBytes is the longest query registered as a persisted query; a
	// longer one runs but is not registered. Default DefaultAPQQueryBytes.
	APQQueryBytes int
	// APQBytesPerAddr is how many bytes of persisted queries one client
	// address (IPv6 per /64) may have registered, counted until APQTTL
	// after its last registration; beyond it a query runs but is not
	// registered. Default DefaultAPQBytesPerAddr.
	APQBytesPerAddr int64
	// GateSlots is how many queries and mutations that are not priority
	// operations (commits and cancels: priority.go) are on the CPU at once
	// in this process (one waiting for Redis, a reserve batch or a loader
	// gives its slot back meanwhile); the others wait for a slot, in order,
	// for at most GateWait, then get SERVER_BUSY. 0 or a negative GateSlots
	// leaves the gate off (SuggestedGateSlots() is where to start); GateWait
	// defaults to DefaultGateWait.
	GateSlots int
	GateWait  time.Duration
}

// Defaults of the persisted queries' bounds (Limits).
const (
	DefaultAPQQueryBytes   = 32 << 10
	DefaultAPQBytesPerAddr = 1 << 20
)

// The cost limits' defaults. An operation may cost 2000: a hundred
// reservations with every field, a full cart's payload, a drop page. A
// budget holds five such operations at once and gets one back every two
// seconds.
const (
	DefaultComplexity = 2000
	DefaultCostRate   = 1000
	DefaultCostBurst  = 5 * DefaultComplexity
	// DefaultResponseBytes is 1 MiB, many times the largest response
	// within DefaultComplexity (a hundred products with every field is
	// about 60 KB).
	DefaultResponseBytes = 1 << 20
)

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.Complexity, DefaultComplexity)
	def(&l.CostRate, DefaultCostRate)
	def(&l.CostBurst, DefaultCostBurst)
	def(&l.Depth, 10)
	def(&l.RootMutationFields, 10)
	def(&l.ParserTokens, 15000)
	def(&l.QueryCache, 1000)
	if l.BodyBytes == 0 {
		l.BodyBytes = 1 << 20
	}
	if l.ResponseBytes == 0 {
		l.ResponseBytes = DefaultResponseBytes
	}
	if l.APQTTL == 0 {
		l.APQTTL = 24 * time.Hour
	}
	def(&l.APQQueryBytes, DefaultAPQQueryBytes)
	if l.APQBytesPerAddr == 0 {
		l.APQBytesPerAddr = DefaultAPQBytesPerAddr
	}
	if l.GateSlots < 0 {
		l.GateSlots = 0
	}
	if l.GateWait <= 0 {
		l.GateWait = DefaultGateWait
	}
	return l
}

// NewHandler builds the /graphql handler: CORS, auth and the body limit
// around gqlgen's server with its transports, caches and limits, over the
// resolvers. It panics when a required dependency is missing, as that is a
// wiring bug found at start-up.
func NewHandler(cfg Config) http.Handler { return newHandler(cfg, handlerOptions{share: true}) }

// handlerOptions are what tests change to compare the handler with what
// gqlgen alone answers.
type handlerOptions struct {
	// share executes identical shareable subscriptions once (shared.go);
	// false executes every one on its own.
	share bool
	// websocket, when set, replaces the websocket transport.
	websocket func(*wsTransport) gqlgen.Transport
	// gate, when set, replaces the gate Limits.GateSlots would make.
	gate *gate
	// noReserveAnswers executes every reserve instead of answering the
	// plain ones in the HTTP transport (reserve_answer.go).
	noReserveAnswers bool
	// server, when set, is handed gqlgen's server once it is built, for a
	// test to look at its extensions.
	server func(*handler.Server)
}

// newHandler is NewHandler with opts.
func newHandler(cfg Config, opts handlerOptions) http.Handler {
	if cfg.Engine == nil || cfg.Redis == nil || cfg.Verifier == nil {
		panic("graphql.NewHandler: Engine, Redis and Verifier are required")
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Streams = cfg.Streams.withDefaults()
	prefix := cfg.Engine.Config().KeyPrefix
	origins := newCORS(cfg.CORSOrigins)
	sm := newStreamMetrics(cfg.Registerer)
	res := resolvers.New(resolvers.Config{
		Engine: cfg.Engine,
		Live:   cfg.Live,
		Limits: resolvers.Limits{
			PageSize:       cfg.Limits.PageSize,
			MaxPageSize:    cfg.Limits.MaxPageSize,
			MutationRate:   cfg.Limits.MutationRate,
			MutationPeriod: cfg.Limits.MutationPeriod,
			MutationBurst:  cfg.Limits.MutationBurst,
		},
		ReservationRecheck: cfg.Streams.ReservationRecheck,
		Registerer:         cfg.Registerer,
		QueueSecret:        cfg.QueueSecret,
	})

	srv := handler.New(res.Schema())
	var groups *subscriptionGroups
	if opts.share && cfg.Live != nil {
		groups = newSubscriptionGroups(res, cfg.Registerer)
	}
	var ws gqlgen.Transport = newWebsocket(cfg.Streams, origins, cfg.Verifier, sm, groups)
	if opts.websocket != nil {
		ws = opts.websocket(ws.(*wsTransport))
	}
	// Plain reserves, and the refusals the sold-out memory decides, are
	// answered in the HTTP transport (reserve_answer.go), except when
	// tracing is on.
	var answers *reserveAnswers
	if cfg.Tracer == nil && !opts.noReserveAnswers {
		answers = newReserveAnswers(res, cfg.Registerer)
	}
	addTransports(srv, ws, cfg.Streams, groups, answers)
	var vars *reserveVars
	if answers != nil {
		// Its cache hands a plain reserve's document out without the
		// variable's declaration, and its extension, first of all, puts
		// it back (reserve_vars.go).
		vars = newReserveVars(lru.New[*ast.QueryDocument](cfg.Limits.QueryCache))
		srv.SetQueryCache(vars)
	} else {
		srv.SetQueryCache(lru.New[*ast.QueryDocument](cfg.Limits.QueryCache))
	}
	srv.SetParserTokenLimit(cfg.Limits.ParserTokens)
	srv.SetDisableSuggestion(!cfg.Dev)
	srv.SetErrorPresenter(res.ErrorPresenter())
	srv.SetRecoverFunc(res.Recover())
	// The extensions, in order; useExtensions puts reserveVars before all
	// of them.
	var exts []gqlgen.HandlerExtension
	// Before every other extension (but reserveVars, which is off when
	// tracing is on), so that its span covers what they do.
	if cfg.Tracer != nil {
		exts = append(exts, operationTracer{tracer: cfg.Tracer.Tracer("github.com/dropline/dropline/server/graphql")})
	}
	if cfg.Dev {
		exts = append(exts, extension.Introspection{})
	}
	exts = append(exts,
		newSubgraph(cfg.Subgraph),
		depthLimit{max: cfg.Limits.Depth},
		mutationFieldLimit{max: cfg.Limits.RootMutationFields})
	// After the limits, so that only an operation nothing else refuses
	// spends its cost.
	cost := queryCost{price: newComplexityLimit(cfg.Limits.Complexity, cfg.Limits.QueryCache),
		maxBytes: cfg.Limits.ResponseBytes, refused: newCostRefusals(cfg.Registerer)}
	if cfg.Limits.CostRate > 0 {
		cost.budgets = newCostBudgets(cfg.Limits.CostRate, cfg.Limits.CostBurst, cfg.Now)
	}
	exts = append(exts, cost)
	if answers != nil {
		answers.cost = cost
	}
	// After the cost, whose budget may refuse an operation when it is
	// dispatched: a persisted query is registered only once it runs. Its
	// hash is looked up before any of the above (parameters come first),
	// as is a trusted document's id.
	if cfg.TrustedDocuments != nil {
		exts = append(exts, newTrustedOnly(cfg.TrustedDocuments, cfg.Dev, cfg.Registerer))
	} else {
		exts = append(exts, newPersistedQueries(cfg.Redis, prefix, cfg.Limits, cfg.Registerer))
	}
	// Last of the extensions: only what will run waits for a slot.
	g := opts.gate
	if g == nil {
		g = newGate(cfg.Limits.GateSlots, cfg.Limits.GateWait, cfg.Registerer)
	}
	exts = append(exts, g)
	if answers != nil {
		answers.gate = g
	}
	useExtensions(srv, vars, exts)
	srv.AroundOperations(func(ctx context.Context, next gqlgen.OperationHandler) gqlgen.ResponseHandler {
		return next(res.WithLoaders(ctx))
	})
	// A subscription is one operation with many responses: each response
	// gets fresh loaders, or a payload's product.stock would be the value
	// cached when the subscription began.
	srv.AroundResponses(func(ctx context.Context, next gqlgen.ResponseHandler) *gqlgen.Response {
		// A body gqlgen cannot decode reaches here with no operation at all.
		if !gqlgen.HasOperationContext(ctx) {
			return next(ctx)
		}
		if oc := gqlgen.GetOperationContext(ctx); oc.Operation != nil && oc.Operation.Operation == ast.Subscription {
			ctx = res.WithLoaders(ctx)
		}
		return next(ctx)
	})
	if opts.server != nil {
		opts.server(srv)
	}

	var h http.Handler = srv
	h = newStreamTracker(cfg.Streams, sm).middleware(h)
	// The gate comes before the token's check, after the body is read
	// (its slot is for the CPU, and the body tells a commit).
	h = auth.Middleware(cfg.Verifier, refuseToken)(h)
	h = g.middleware(h)
	h = limitBody(cfg.Limits.BodyBytes, h)
	h = origins.middleware(h)
	return h
}

// useExtensions installs the extensions of srv's operations: vars first
// when it is on, then exts in their order. vars must be the first of the
// operation context mutators, because it puts back the document its cache
// replaced (reserve_vars.go) before any other sees the operation; taking
// it apart from the others makes that order the only one possible.
// TestReserveVarsIsTheFirstMutator checks the built server.
func useExtensions(srv *handler.Server, vars *reserveVars, exts []gqlgen.HandlerExtension) {
	if vars != nil {
		srv.Use(vars)
	}
	for _, e := range exts {
		srv.Use(e)
	}
}

// addTransports is the one place transports are chosen. Queries and
// mutations go over plain HTTP (httpTransport: POST with an
// application/json body, GET for queries only). Subscriptions ride on
// websockets (graphql-transport-ws and the legacy graphql-ws: wsTransport)
// or on GraphQL over SSE (a POST with Accept: text/event-stream), which
// must come before POST as both accept application/json. gqlgen picks the
// first transport that supports a request. With groups, identical
// shareable subscriptions on either stream transport are executed once for
// all (shared.go).
func addTransports(srv *handler.Server, ws gqlgen.Transport, l StreamLimits, groups *subscriptionGroups, answers *reserveAnswers) {
	srv.AddTransport(ws)
	srv.AddTransport(newSSE(l, groups))
	srv.AddTransport(httpTransport{method: http.MethodGet})
	srv.AddTransport(httpTransport{method: http.MethodPost, answers: answers})
}
