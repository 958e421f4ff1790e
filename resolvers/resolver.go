package resolvers

import (
	"context"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/graph"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/webhook"
)

// Config is what New needs. Engine is required; every limit has a default
// for its zero value.
type Config struct {
	// Engine answers every query and mutation, and keeps the mutation rate
	// limiter's state in Redis under its key prefix. Required.
	Engine *inventory.Engine
	// Live fans stock changes out to subscriptions. Nil leaves the
	// Subscription fields answering UNAVAILABLE (queries and mutations
	// still work). The caller starts and stops it.
	Live *live.Hub
	// Limits bound pages and the mutation rate.
	Limits Limits
	// ReservationRecheck is how often reservationChanged re-reads its
	// reservation besides every stock change of its SKU. Default 1 s.
	ReservationRecheck time.Duration
	// Registerer receives the subscription metrics. Nil: not exported.
	Registerer prometheus.Registerer
	// QueueSecret signs the admission queues' proof-of-work challenges;
	// every instance must share it. Nil: a random one, so a challenge
	// verifies only on the instance that gave it.
	QueueSecret []byte
}

// The mutation limit's defaults; config's DROPLINE_MUTATION_RATE and
// DROPLINE_MUTATION_BURST default to them.
const (
	DefaultMutationRate = 10
	// burstPerRate is the burst a rate gets when no burst is given: twice
	// the rate, and never less than the largest cart, which spends one
	// unit per line.
	burstPerRate         = 2
	DefaultMutationBurst = max(burstPerRate*DefaultMutationRate, inventory.MaxCartLines)
)

// Limits are what the resolvers themselves bound. Each zero value takes the
// default named on the field.
type Limits struct {
	// PageSize is the default `first` of connections; MaxPageSize the
	// largest allowed (requests above get INVALID_INPUT). Defaults 20, 100.
	PageSize    int
	MaxPageSize int
	// MutationRate and MutationBurst define the per-principal mutation
	// limit (GCRA): MutationRate per MutationPeriod on average, bursts of
	// up to MutationBurst. Each mutation spends one unit, a cart one per
	// line. Defaults DefaultMutationRate per second, and a burst of twice
	// the rate but at least inventory.MaxCartLines (DefaultMutationBurst
	// with the default rate). A negative MutationRate disables the limit.
	MutationRate   int
	MutationPeriod time.Duration
	MutationBurst  int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.PageSize, 20)
	def(&l.MaxPageSize, 100)
	def(&l.MutationRate, DefaultMutationRate)
	def(&l.MutationBurst, max(burstPerRate*l.MutationRate, inventory.MaxCartLines))
	if l.MutationPeriod == 0 {
		l.MutationPeriod = time.Second
	}
	return l
}

// Resolver is the root of the generated resolver tree. It holds only
// injected dependencies; per-request state (dataloaders) lives in the
// request context.
type Resolver struct {
	deps *deps
}

// New builds the resolver tree. It panics when a required dependency is
// missing, as that is a wiring bug found at start-up.
func New(cfg Config) *Resolver {
	if cfg.Engine == nil {
		panic("resolvers.New: Engine is required")
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.ReservationRecheck <= 0 {
		cfg.ReservationRecheck = time.Second
	}
	prefix := cfg.Engine.Config().KeyPrefix
	queues := queue.New(queue.Config{Secret: cfg.QueueSecret}, cfg.Engine.Redis(), cfg.Engine)
	if cfg.Live != nil {
		cfg.Live.SetQueueReader(queues)
	}
	return &Resolver{deps: &deps{
		engine:  cfg.Engine,
		limits:  cfg.Limits,
		limiter: newMutationLimiter(cfg.Engine, prefix, cfg.Limits),
		hub:     cfg.Live,
		recheck: cfg.ReservationRecheck,
		sm:      newSubscriptionMetrics(cfg.Registerer),
		hooks:   webhook.NewService(cfg.Engine.Ledger()),
		queues:  queues,
		tickets: newTicketNumbers(),
	}}
}

// Schema is the executable schema over these resolvers, every list priced
// at the most items it can return (complexity.go).
func (r *Resolver) Schema() gqlgen.ExecutableSchema {
	return pricedSchema{ExecutableSchema: graph.NewExecutableSchema(graph.Config{Resolvers: r}), limits: r.deps.limits}
}

// WithLoaders gives an operation, or one response of a subscription, its
// own dataloaders.
func (r *Resolver) WithLoaders(ctx context.Context) context.Context {
	return withLoaders(ctx, r.deps.engine)
}

// ErrorPresenter is the one place errors become what clients see. It logs
// through the request's logger (zerolog.Ctx), which carries the request id.
func (r *Resolver) ErrorPresenter() gqlgen.ErrorPresenterFunc { return presenter() }

// Recover turns a panic in a resolver into an internal error, logged
// through the request's logger. It answers the operation with a GraphQL
// error; a panic outside gqlgen is the HTTP server's recoverer's.
func (r *Resolver) Recover() gqlgen.RecoverFunc { return recoverer() }
