package graphql

import (
	"context"
	"errors"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// apqCache keeps automatic persisted queries in Redis, so a hash registered
// through one instance is known to all of them. A Redis failure is a cache
// miss: the client resends the full query.
type apqCache struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
}

var _ gqlgen.Cache[string] = apqCache{}

func newAPQCache(rdb redis.UniversalClient, prefix string, ttl time.Duration) apqCache {
	return apqCache{rdb: rdb, prefix: prefix + "apq:", ttl: ttl}
}

// Get returns the query registered under a sha256 hash.
func (c apqCache) Get(ctx context.Context, hash string) (string, bool) {
	q, err := c.rdb.Get(ctx, c.prefix+hash).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			zerolog.Ctx(ctx).Warn().Err(err).Msg("reading persisted query")
		}
		return "", false
	}
	return q, true
}

// Add registers a query; gqlgen has already checked that hash matches it.
func (c apqCache) Add(ctx context.Context, hash, query string) {
	if err := c.rdb.Set(ctx, c.prefix+hash, query, c.ttl).Err(); err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("storing persisted query")
	}
}
