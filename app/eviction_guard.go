package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/config"
)

// safePolicy is the only maxmemory-policy Dropline serves with: every other
// policy evicts keys under memory pressure (the volatile-* ones too, and
// holds, idempotency records and leases all have a TTL).
const safePolicy = "noeviction"

// EvictingRedisError refuses a Redis server whose maxmemory-policy evicts
// keys. Dropline's keys are state, not cache: an evicted hold, counter or
// outbox entry is lost without anyone noticing.
type EvictingRedisError struct {
	// Node is the server's address.
	Node string
	// Policy is its maxmemory-policy.
	Policy string
}

func (e *EvictingRedisError) Error() string {
	return fmt.Sprintf("Redis at %s runs with maxmemory-policy %s, which evicts keys under memory pressure, "+
		"and an evicted hold or outbox entry would be lost silently: set maxmemory-policy %s "+
		"(CONFIG SET maxmemory-policy %s, and in its redis.conf or your provider's parameter group)",
		e.Node, e.Policy, safePolicy, safePolicy)
}

// evictionGuard reads maxmemory-policy on every new Redis connection, so
// the check holds at start and on every reconnect (a restarted or promoted
// server, a new cluster node), of every server Dropline talks to: the
// single server, the Sentinel-chosen primary, every cluster node. A
// connection to an evicting server fails with EvictingRedisError, so
// Dropline serves nothing from it (every command on it answers that error,
// /readyz fails) until the policy is fixed; a server that does not let the
// policy be read (CONFIG renamed or denied, as on several managed
// services) is served with a warning, once per server. Sentinels are not
// checked: they hold no keys.
type evictionGuard struct {
	log zerolog.Logger

	mu    sync.Mutex
	state map[string]string // node -> the policy last reported, or "unreadable"
}

func newEvictionGuard(log zerolog.Logger) *evictionGuard {
	return &evictionGuard{log: log, state: map[string]string{}}
}

// install makes every connection the options open pass the guard.
func (g *evictionGuard) install(opts config.RedisOptions) {
	switch {
	case opts.Cluster != nil:
		opts.Cluster.OnConnect = g.onConnect
	case opts.Sentinel != nil:
		opts.Sentinel.OnConnect = g.onConnect
	case opts.Single != nil:
		opts.Single.OnConnect = g.onConnect
	}
}

// onConnect is the connection hook (redis.Options.OnConnect).
func (g *evictionGuard) onConnect(ctx context.Context, cn *redis.Conn) error {
	node := nodeOf(ctx, cn)
	got, err := cn.ConfigGet(ctx, "maxmemory-policy").Result()
	policy := got["maxmemory-policy"]
	var reply redis.Error
	switch {
	case err != nil && !errors.As(err, &reply):
		return err // the connection itself failed
	case err != nil || policy == "":
		if role, _ := cn.Do(ctx, "ROLE").Slice(); len(role) > 0 && role[0] == "sentinel" {
			return nil
		}
		g.report(node, "unreadable", func() {
			g.log.Warn().Str("redis", node).AnErr("error", err).
				Msg("cannot read Redis' maxmemory-policy (CONFIG GET is renamed or not allowed): make sure it is noeviction, or evicted holds and outbox entries are lost silently")
		})
		return nil
	case policy != safePolicy:
		refused := &EvictingRedisError{Node: node, Policy: policy}
		g.report(node, policy, func() {
			g.log.Error().Str("redis", node).Str("maxmemory_policy", policy).Msg(refused.Error())
		})
		return refused
	}
	g.report(node, policy, func() {})
	return nil
}

// report runs say when node's state changed since the last report, so a
// server refused or unreadable is logged once, not on every connection.
func (g *evictionGuard) report(node, state string, say func()) {
	g.mu.Lock()
	prev, seen := g.state[node]
	g.state[node] = state
	g.mu.Unlock()
	if prev != state && (seen || state != safePolicy) {
		if state == safePolicy {
			g.log.Info().Str("redis", node).Msg("Redis' maxmemory-policy is noeviction again: serving from it")
			return
		}
		say()
	}
}

// nodeOf is the address of the server cn talks to: the one its client
// was given ("Redis<host:port db:0>"), or, for a Sentinel client, which
// dials whichever server is the primary ("Redis<FailoverClient db:0>"),
// the address the server itself reports (CLIENT INFO's laddr).
func nodeOf(ctx context.Context, cn *redis.Conn) string {
	s := strings.TrimPrefix(cn.String(), "Redis<")
	if i := strings.IndexByte(s, ' '); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimSuffix(s, ">")
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s
	}
	info, err := cn.ClientInfo(ctx).Result()
	if err != nil || info.LAddr == "" {
		return s
	}
	return info.LAddr
}
