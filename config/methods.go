package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/server/graphql"
)

// ClientAddr returns the resolver of client addresses the HTTP server
// uses. Call it on a validated Config: an invalid list is Validate's to
// report, and here trusts no one.
func (c Config) ClientAddr() clientaddr.Resolver {
	trusted, err := clientaddr.ParsePrefixes(c.TrustedProxies)
	header, herr := clientaddr.ParseHeader(c.ClientAddrHeader)
	if err != nil || herr != nil {
		return clientaddr.Resolver{}
	}
	return clientaddr.NewResolver(trusted, header)
}

// StreamLimits returns the bounds of websocket and SSE subscriptions.
func (c Config) StreamLimits() graphql.StreamLimits {
	return graphql.StreamLimits{
		ConnsPerIP:           c.StreamConnsPerIP,
		ConnsPerPrincipal:    c.StreamConnsPerPrincipal,
		SubscriptionsPerConn: c.StreamSubsPerConn,
		MessageBytes:         int64(c.StreamMessageBytes),
		InitTimeout:          c.StreamInitTimeout,
		PingInterval:         c.StreamPingInterval,
		WriteTimeout:         c.StreamWriteTimeout,
	}
}

// JWTKey returns the HS256 key to sign and verify tokens with: JWTSecret,
// or DevJWTSecret in dev mode when no secret is set. UsingDevSecret tells
// the caller when to warn.
func (c Config) JWTKey() []byte {
	if c.JWTSecret == "" && c.Dev {
		return []byte(DevJWTSecret)
	}
	return []byte(c.JWTSecret)
}

// UsingDevSecret reports whether tokens are signed with the public
// DevJWTSecret, so the program can warn loudly at start.
func (c Config) UsingDevSecret() bool {
	return c.Dev && (c.JWTSecret == "" || c.JWTSecret == DevJWTSecret)
}

// AllowedOrigins returns the cross-origin allow list the HTTP server
// enforces: CORSOrigins, plus DevOrigin in dev mode.
func (c Config) AllowedOrigins() []string {
	out := append([]string(nil), c.CORSOrigins...)
	if c.Dev && !contains(out, DevOrigin) {
		out = append(out, DevOrigin)
	}
	return out
}
func parseDuration(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64((1<<63-1)/int64(time.Second)) {
			return 0, fmt.Errorf("out of range")
		}
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}
func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "t", "true", "y", "yes", "on":
		return true, nil
	case "0", "f", "false", "n", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("invalid boolean %q", v)
}
func splitList(v string) []string {
	var out []string
	for _, part := range strings.Split(v, ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}
func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// SuggestedGateSlots is where to start when turning the gate on:
// GateSlotsPerCPU per core the process runs on (GOMAXPROCS).
func SuggestedGateSlots() int { return graphql.SuggestedGateSlots() }
