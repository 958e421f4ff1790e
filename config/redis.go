package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RedisOptions is the parsed form of REDIS_URL / REDIS_CLUSTER_ADDRS:
// exactly one of Single and Cluster is set. Keeping go-redis's own option
// types (rather than flattening into UniversalOptions) keeps every URL
// option go-redis understands.
type RedisOptions struct {
	// Single is set for a single Redis server (redis:// or rediss://).
	Single *redis.Options
	// Cluster is set for Redis Cluster (redis-cluster://, rediss-cluster://
	// or REDIS_CLUSTER_ADDRS).
	Cluster *redis.ClusterOptions
}

// Addrs lists the configured node addresses, for messages and readiness.
func (o RedisOptions) Addrs() []string {
	if o.Cluster != nil {
		return append([]string(nil), o.Cluster.Addrs...)
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
	default:
		return RedisOptions{}, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis-cluster, rediss-cluster", scheme)
	}
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
