package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory"
)

// RedisOptions is the parsed form of REDIS_URL / REDIS_CLUSTER_ADDRS:
// exactly one of Single, Cluster and Sentinel is set. Keeping go-redis's own option
// types (rather than flattening into UniversalOptions) keeps every URL
// option go-redis understands.
type RedisOptions struct {
	// Single is set for a single Redis server (redis:// or rediss://).
	Single *redis.Options
	// Cluster is set for Redis Cluster (redis-cluster://, rediss-cluster://
	// or REDIS_CLUSTER_ADDRS).
	Cluster *redis.ClusterOptions
	// Sentinel is set for a primary with replicas under Redis Sentinel
	// (redis-sentinel:// or rediss-sentinel://): the client asks the
	// sentinels for the primary and follows it through failovers.
	Sentinel *redis.FailoverOptions
}

// Addrs lists the configured node addresses, for messages and readiness.
func (o RedisOptions) Addrs() []string {
	if o.Cluster != nil {
		return append([]string(nil), o.Cluster.Addrs...)
	}
	if o.Sentinel != nil {
		return append([]string(nil), o.Sentinel.SentinelAddrs...)
	}
	if o.Single != nil {
		return []string{o.Single.Addr}
	}
	return nil
}

// NewClient builds the client the options describe. Both kinds satisfy
// redis.UniversalClient, which is all the rest of Dropline depends on, so
// single-node and cluster deployments run the same code.
func (o RedisOptions) NewClient() redis.UniversalClient {
	if o.Cluster != nil {
		return redis.NewClusterClient(o.Cluster)
	}
	if o.Sentinel != nil {
		return redis.NewFailoverClient(o.Sentinel)
	}
	return redis.NewClient(o.Single)
}

// RedisOptions parses RedisURL and RedisClusterAddrs. Errors never contain
// the password.
func (c Config) RedisOptions() (RedisOptions, error) {
	raw := c.RedisURL
	if raw == "" {
		return RedisOptions{}, fmt.Errorf("is empty")
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return RedisOptions{}, fmt.Errorf("%q has no scheme", RedactURL(raw))
	}
	switch scheme {
	case "redis", "rediss", "unix":
		if len(c.RedisClusterAddrs) == 0 {
			opts, err := redis.ParseURL(raw)
			if err != nil {
				return RedisOptions{}, fmt.Errorf("cannot parse %s (%s)", RedactURL(raw), redactErr(err, raw))
			}
			return RedisOptions{Single: opts}, nil
		}
		if scheme == "unix" {
			return RedisOptions{}, fmt.Errorf("a unix socket URL cannot be combined with %s", EnvRedisClusterAddrs)
		}
		u, err := url.Parse(raw)
		if err != nil {
			return RedisOptions{}, fmt.Errorf("cannot parse %s", RedactURL(raw))
		}
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			return RedisOptions{}, fmt.Errorf("selects database %s, but Redis Cluster has only database 0", db)
		}
		return clusterOptions(scheme, u.User, c.RedisClusterAddrs, u.RawQuery)
	case "redis-cluster", "rediss-cluster":
		base := strings.TrimSuffix(scheme, "-cluster")
		user, hosts, query, err := splitClusterURL(raw)
		if err != nil {
			return RedisOptions{}, err
		}
		if len(c.RedisClusterAddrs) > 0 {
			hosts = c.RedisClusterAddrs
		}
		return clusterOptions(base, user, hosts, query)
	case "redis-sentinel", "rediss-sentinel":
		if len(c.RedisClusterAddrs) > 0 {
			return RedisOptions{}, fmt.Errorf("a sentinel URL cannot be combined with %s", EnvRedisClusterAddrs)
		}
		return sentinelOptions(strings.TrimSuffix(scheme, "-sentinel"), raw)
	default:
		return RedisOptions{}, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis-cluster, rediss-cluster, redis-sentinel, rediss-sentinel", scheme)
	}
}

// sentinelOptions reads
// "redis-sentinel://[user[:pass]@]s1:p1,s2:p2[/db]?master=NAME[&options]".
// The user and password are the Redis servers' (as in redis://);
// sentinel_username and sentinel_password, when the sentinels require
// their own, and every other option go-redis' ParseFailoverURL knows
// (dial_timeout, pool_size, ...) are query options. The URL is rebuilt in
// go-redis' own form (first sentinel as the host, the others as addr=) so
// its parser validates the options.
func sentinelOptions(scheme, raw string) (RedisOptions, error) {
	_, rest, _ := strings.Cut(raw, "://")
	rest, query, _ := strings.Cut(rest, "?")
	var user *url.Userinfo
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		name, pass, hasPass := strings.Cut(rest[:at], ":")
		var err error
		if name, err = url.PathUnescape(name); err != nil {
			return RedisOptions{}, fmt.Errorf("cannot parse the user name of %s", RedactURL(raw))
		}
		if hasPass {
			if pass, err = url.PathUnescape(pass); err != nil {
				return RedisOptions{}, fmt.Errorf("cannot parse the password of %s", RedactURL(raw))
			}
		}
		user = url.UserPassword(name, pass)
		if !hasPass {
			user = url.User(name)
		}
		rest = rest[at+1:]
	}
	hostList, path, _ := strings.Cut(rest, "/")
	hosts := splitList(hostList)
	if len(hosts) == 0 {
		return RedisOptions{}, fmt.Errorf("%s lists no sentinels", RedactURL(raw))
	}
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return RedisOptions{}, fmt.Errorf("sentinel %q is not host:port", h)
		}
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return RedisOptions{}, fmt.Errorf("cannot parse the options of %s", RedactURL(raw))
	}
	if m := q.Get("master"); m != "" {
		q.Del("master")
		q.Set("master_name", m)
	}
	if q.Get("master_name") == "" {
		return RedisOptions{}, fmt.Errorf("%s names no primary: add ?master=NAME, the name the sentinels monitor", RedactURL(raw))
	}
	sentinelUser := url.UserPassword(q.Get("sentinel_username"), q.Get("sentinel_password"))
	if q.Get("sentinel_password") == "" {
		sentinelUser = nil
		if n := q.Get("sentinel_username"); n != "" {
			sentinelUser = url.User(n)
		}
	}
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	if user != nil {
		if n := user.Username(); n != "" {
			q.Set("username", n)
		}
		if p, ok := user.Password(); ok {
			q.Set("password", p)
		}
	}
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	u := url.URL{Scheme: scheme, User: sentinelUser, Host: hosts[0], Path: "/" + path, RawQuery: q.Encode()}
	opts, err := redis.ParseFailoverURL(u.String())
	if err != nil {
		msg := redactErr(err, u.String())
		if user != nil {
			if p, ok := user.Password(); ok && p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
		return RedisOptions{}, fmt.Errorf("cannot parse sentinel options (%s)", msg)
	}
	return RedisOptions{Sentinel: opts}, nil
}

// splitClusterURL takes "redis-cluster://[user[:pass]@]h1:p1,h2:p2[/][?q]"
// apart by hand: net/url rejects a comma separated host list.
func splitClusterURL(raw string) (*url.Userinfo, []string, string, error) {
	_, rest, _ := strings.Cut(raw, "://")
	rest, query, _ := strings.Cut(rest, "?")
	var user *url.Userinfo
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		name, pass, hasPass := strings.Cut(rest[:at], ":")
		var err error
		if name, err = url.PathUnescape(name); err != nil {
			return nil, nil, "", fmt.Errorf("cannot parse the user name of %s", RedactURL(raw))
		}
		if hasPass {
			if pass, err = url.PathUnescape(pass); err != nil {
				return nil, nil, "", fmt.Errorf("cannot parse the password of %s", RedactURL(raw))
			}
			user = url.UserPassword(name, pass)
		} else {
			user = url.User(name)
		}
		rest = rest[at+1:]
	}
	hostList, path, _ := strings.Cut(rest, "/")
	if path != "" && path != "0" {
		return nil, nil, "", fmt.Errorf("%s selects database %s, but Redis Cluster has only database 0", RedactURL(raw), path)
	}
	hosts := splitList(hostList)
	if len(hosts) == 0 {
		return nil, nil, "", fmt.Errorf("%s lists no nodes", RedactURL(raw))
	}
	return user, hosts, query, nil
}

// clusterOptions rebuilds a go-redis cluster URL (first node as the host,
// the others as addr= parameters) so ParseClusterURL validates the options.
func clusterOptions(scheme string, user *url.Userinfo, hosts []string, query string) (RedisOptions, error) {
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return RedisOptions{}, fmt.Errorf("cluster node %q is not host:port", h)
		}
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return RedisOptions{}, fmt.Errorf("cannot parse the options %q", query)
	}
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	u := url.URL{Scheme: scheme, User: user, Host: hosts[0], RawQuery: q.Encode()}
	opts, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return RedisOptions{}, fmt.Errorf("cannot parse cluster options (%s)", redactErr(err, u.String()))
	}
	// Within a second of a failover, not go-redis' minute.
	opts.ClusterStateReloadInterval = inventory.ClusterStateReloadInterval
	return RedisOptions{Cluster: opts}, nil
}

// redactErr renders err with any password of raw masked.
func redactErr(err error, raw string) string {
	msg := err.Error()
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if p, has := u.User.Password(); has && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}
