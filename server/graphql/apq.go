package graphql

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/prom"
)

// CodePersistedQueryNotFound answers a hash the server does not know; the
// client then sends the query with its hash (Apollo's APQ protocol).
const CodePersistedQueryNotFound = "PERSISTED_QUERY_NOT_FOUND"

// apqKeyCost is what one registration is charged beyond its query's
// bytes: about what Redis keeps for a key of its own (MEMORY USAGE of a
// 100-byte query under its key is 248 bytes).
const apqKeyCost = 200

// apqStats names the persisted query's gqlgen stats, as gqlgen's own
// extension does (extension.GetApqStats reads them).
const apqStats = "APQ"

// persistedQueries serves automatic persisted queries (Apollo's APQ
// protocol, as gqlgen's extension.AutomaticPersistedQuery speaks it) from
// Redis, so a hash registered through one instance is known to all.
//
// Unlike gqlgen's extension, which stores a query as soon as its hash
// matches, a query is registered only when it runs: after it parsed,
// validated and passed every limit (InterceptOperation is called by the
// executor's dispatch, which a refused operation never reaches). Junk
// with a correct hash costs Redis nothing. A registered query is at most
// maxBytes long (a longer one runs, unregistered: the client keeps
// sending it whole), and one client address (clientaddr.Key) may have at
// most budget bytes registered, each registration charged its query's
// length plus apqKeyCost, until ttl after its last registration: so no
// address can make Redis keep more than about budget bytes of persisted
// queries, however many distinct valid queries it sends. A query already
// registered costs nothing. A Redis failure is a cache miss, and a
// registration that does not happen is only a round trip more for the
// client.
type persistedQueries struct {
	rdb      redis.UniversalClient
	prefix   string // P+"apq:" for queries; P+"apqbudget:" for the budgets
	budgets  string
	ttl      time.Duration
	maxBytes int
	budget   int64
	skipped  *prometheus.CounterVec
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationParameterMutator
	gqlgen.OperationInterceptor
} = (*persistedQueries)(nil)

func newPersistedQueries(rdb redis.UniversalClient, prefix string, l Limits, reg prometheus.Registerer) *persistedQueries {
	return &persistedQueries{
		rdb: rdb, prefix: prefix + "apq:", budgets: prefix + "apqbudget:", ttl: l.APQTTL,
		maxBytes: l.APQQueryBytes, budget: l.APQBytesPerAddr,
		skipped: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_persisted_queries_skipped_total",
			Help: "Queries sent with their hash that ran but were not registered as persisted queries, by reason (too_large, budget).",
		}, []string{"reason"})),
	}
}

// ExtensionName names the extension in gqlgen's stats.
func (*persistedQueries) ExtensionName() string { return "AutomaticPersistedQuery" }

// Validate accepts any schema.
func (*persistedQueries) Validate(gqlgen.ExecutableSchema) error { return nil }

// MutateOperationParameters reads the persistedQuery extension: a hash
// alone is replaced by the query registered under it, or refused with
// PERSISTED_QUERY_NOT_FOUND; a query with its hash must match it, and is
// marked for registration should it run.
func (p *persistedQueries) MutateOperationParameters(ctx context.Context, raw *gqlgen.RawParams) *gqlerror.Error {
	ext, present := raw.Extensions["persistedQuery"]
	if !present || ext == nil {
		if raw.Query == "" && raw.Extensions[extDocumentID] != nil {
			// An id alone names a trusted document, which only a server
			// with a manifest knows (trustedOnly).
			return persistedQueryNotFound()
		}
		return nil
	}
	pq, _ := ext.(map[string]any)
	hash, _ := pq["sha256Hash"].(string)
	if pq == nil || hash == "" {
		return gqlerror.Errorf("invalid APQ extension data")
	}
	if fmt.Sprint(pq["version"]) != "1" {
		return gqlerror.Errorf("unsupported APQ version")
	}
	stats := &extension.ApqStats{Hash: hash}
	if raw.Query == "" {
		q, ok := p.get(ctx, hash)
		if !ok {
			return persistedQueryNotFound()
		}
		raw.Query = q
	} else {
		sum := sha256.Sum256([]byte(raw.Query))
		if hex.EncodeToString(sum[:]) != hash {
			return gqlerror.Errorf("provided APQ hash does not match query")
		}
		stats.SentQuery = true
	}
	gqlgen.GetOperationContext(ctx).Stats.SetExtension(apqStats, stats)
	return nil
}

// InterceptOperation registers the operation's query, sent with its hash,
// now that it is about to run.
func (p *persistedQueries) InterceptOperation(ctx context.Context, next gqlgen.OperationHandler) gqlgen.ResponseHandler {
	oc := gqlgen.GetOperationContext(ctx)
	if st, _ := oc.Stats.GetExtension(apqStats).(*extension.ApqStats); st != nil && st.SentQuery {
		p.register(ctx, st.Hash, oc.RawQuery)
	}
	return next(ctx)
}

// get returns the query registered under hash.
func (p *persistedQueries) get(ctx context.Context, hash string) (string, bool) {
	q, err := p.rdb.Get(ctx, p.prefix+hash).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			zerolog.Ctx(ctx).Warn().Err(err).Msg("reading persisted query")
		}
		return "", false
	}
	return q, true
}

// register stores query under hash, within its size bound and the client
// address' budget. Its steps are not one atomic unit (the query's key and
// the budget's live in different cluster slots): a race between two
// registrations of one query can charge a budget for both, never store
// a query uncharged.
func (p *persistedQueries) register(ctx context.Context, hash, query string) {
	log := zerolog.Ctx(ctx)
	if len(query) > p.maxBytes {
		p.skipped.WithLabelValues("too_large").Inc()
		return
	}
	key := p.prefix + hash
	switch n, err := p.rdb.Exists(ctx, key).Result(); {
	case err != nil:
		log.Warn().Err(err).Msg("storing persisted query")
		return
	case n > 0:
		return // registered already: nothing to charge
	}
	cost := int64(len(query) + apqKeyCost)
	budget := p.budgets + clientaddr.KeyFrom(ctx)
	var spent *redis.IntCmd
	_, err := p.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		spent = tx.IncrBy(ctx, budget, cost)
		tx.Expire(ctx, budget, p.ttl) // the budget outlives what it paid for
		return nil
	})
	if err != nil {
		log.Warn().Err(err).Msg("charging a persisted query to its address")
		return
	}
	if spent.Val() > p.budget {
		p.refund(ctx, budget, cost)
		p.skipped.WithLabelValues("budget").Inc()
		return
	}
	stored, err := p.rdb.SetNX(ctx, key, query, p.ttl).Result()
	if err != nil || !stored {
		p.refund(ctx, budget, cost)
	}
	if err != nil {
		log.Warn().Err(err).Msg("storing persisted query")
	}
}

func (p *persistedQueries) refund(ctx context.Context, budget string, cost int64) {
	if err := p.rdb.DecrBy(ctx, budget, cost).Err(); err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("refunding a persisted query's charge")
	}
}
