// Package clientaddr decides which address a request came from, believing
// forwarding headers only from proxies the operator trusts, and carries
// that address in the request context. The HTTP server resolves it once
// per request (server.Config.ClientAddr); the access log and the stream
// caps of the GraphQL handler read it from the context, which the GraphQL
// handler cannot get from the server package it must not import.
//
// The rule is the usual one for forwarding chains: each proxy appends the
// address it received the request from, so the header is read from its
// right end. The TCP peer is the client unless it is a trusted proxy;
// then the header's hops are walked right to left, skipping trusted
// proxies, and the first hop that is not trusted is the client. Anything
// left of it was written by that client and may be forged. A hop that
// cannot be parsed (or an obfuscated or "unknown" Forwarded node) ends the
// walk: the client is then the last trusted hop seen, the one that wrote
// the unreadable entry, so garbage can never name an address of its
// choosing.
package clientaddr

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Header names the forwarding header a Resolver reads.
type Header string

// The forwarding headers a Resolver can read. Exactly one is read: a proxy
// writes one of them, and the other arrives untouched from the client, so
// reading both would let a client choose its own address.
const (
	// XForwardedFor is "X-Forwarded-For: client, proxy1, proxy2", what
	// nginx's $proxy_add_x_forwarded_for and most load balancers write.
	XForwardedFor Header = "x-forwarded-for"
	// Forwarded is RFC 7239's "Forwarded: for=client, for=proxy1".
	Forwarded Header = "forwarded"
)

// ParseHeader accepts "x-forwarded-for" or "forwarded", in any case.
func ParseHeader(s string) (Header, error) {
	switch h := Header(strings.ToLower(strings.TrimSpace(s))); h {
	case XForwardedFor, Forwarded:
		return h, nil
	}
	return "", fmt.Errorf("%q is not x-forwarded-for or forwarded", s)
}

// Resolver finds a request's client address. Its zero value trusts no
// proxy: the client is always the TCP peer.
type Resolver struct {
	trusted []netip.Prefix
	header  Header
}

// NewResolver trusts the forwarding header (XForwardedFor when empty) only
// when it was written by a peer inside one of the trusted prefixes.
func NewResolver(trusted []netip.Prefix, header Header) Resolver {
	if header == "" {
		header = XForwardedFor
	}
	out := make([]netip.Prefix, len(trusted))
	for i, p := range trusted {
		out[i] = p.Masked()
	}
	return Resolver{trusted: out, header: header}
}

// ParsePrefixes parses a list of CIDRs ("10.0.0.0/8", "fd00::/8"); a bare
// address is a prefix of its full length.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Zone() != "" {
				return nil, fmt.Errorf("%q has a zone: list prefixes without one", s)
			}
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), unmappedBits(p)))
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not an address or a CIDR such as 10.0.0.0/8 or fd00::/8", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// unmappedBits keeps a prefix written as ::ffff:10.0.0.0/104 meaning 10.0.0.0/8.
func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		if b := p.Bits() - 96; b >= 0 {
			return b
		}
		return 0
	}
	return p.Bits()
}

func (r Resolver) isTrusted(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Addr returns the client address of req. It is never invalid for a
// request that came over TCP; for anything else (a unix socket, a test
// request with a made-up RemoteAddr) it is the zero Addr and callers use
// the RemoteAddr text.
func (r Resolver) Addr(req *http.Request) netip.Addr {
	peer := parseHop(req.RemoteAddr)
	if !peer.IsValid() || !r.isTrusted(peer) {
		return peer
	}
	hops := r.hops(req)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHop(hops[i])
		if !a.IsValid() {
			return client // the trusted hop that wrote the unreadable entry
		}
		client = a
		if !r.isTrusted(a) {
			return a
		}
	}
	return client // every hop is a trusted proxy: the farthest one
}

// hops lists the header's entries, left to right, across repeated header
// lines (which HTTP defines as one comma separated list).
func (r Resolver) hops(req *http.Request) []string {
	var out []string
	if r.header == Forwarded {
		for _, line := range req.Header.Values("Forwarded") {
			for _, elem := range splitQuoted(line, ',') {
				out = append(out, forwardedFor(elem))
			}
		}
		return out
	}
	for _, line := range req.Header.Values("X-Forwarded-For") {
		for _, h := range strings.Split(line, ",") {
			out = append(out, strings.TrimSpace(h))
		}
	}
	return out
}

// forwardedFor returns the for= value of one Forwarded element
// ("for=192.0.2.1;proto=https"), or "" when it has none.
func forwardedFor(elem string) string {
	for _, pair := range splitQuoted(elem, ';') {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
			v = strings.TrimSpace(v)
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v
		}
	}
	return ""
}

// splitQuoted splits s at sep outside double quotes.
func splitQuoted(s string, sep byte) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case sep:
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// parseHop reads "1.2.3.4", "1.2.3.4:5678", "2001:db8::1",
// "[2001:db8::1]" or "[2001:db8::1]:5678"; zones are dropped and
// IPv4-mapped IPv6 addresses become IPv4. Anything else is invalid.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 64 {
		return netip.Addr{}
	}
	// What looks like "address:port" (every RemoteAddr does) is read as
	// that first: ParseAddr would refuse it with an error, an allocation.
	// What ParseAddrPort takes, ParseAddr refuses and SplitHostPort reads
	// to the same address.
	if i := strings.LastIndexByte(s, ':'); i > 0 && (s[0] == '[' || strings.IndexByte(s, ':') == i) {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return ap.Addr().WithZone("").Unmap()
		}
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap()
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
			return netip.Addr{}
		}
		host = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.WithZone("").Unmap()
}

type key struct{}

// resolved is the context With returns: the address, with its text and
// its key written once, since a request's log line, in-flight cap and
// budgets all ask for them, and its context, in one allocation where
// context.WithValue would make two.
type resolved struct {
	context.Context
	addr      netip.Addr
	text, key string
}

func (r *resolved) Value(k any) any {
	if k == (key{}) {
		return r
	}
	return r.Context.Value(k)
}

// With returns ctx carrying the client address.
func With(ctx context.Context, a netip.Addr) context.Context {
	r := &resolved{Context: ctx, addr: a}
	if a.IsValid() {
		r.text = a.String()
		r.key = r.text
		if a.Is6() {
			r.key = group(a)
		}
	}
	return r
}

func resolvedFrom(ctx context.Context) (*resolved, bool) {
	r, ok := ctx.Value(key{}).(*resolved)
	return r, ok && r.addr.IsValid()
}

// From returns the client address ctx carries, or false when the request
// did not pass through a resolver.
func From(ctx context.Context) (netip.Addr, bool) {
	if r, ok := resolvedFrom(ctx); ok {
		return r.addr, true
	}
	return netip.Addr{}, false
}

// Of returns the client address of req as text: the resolved one when the
// server put it in the context, else the TCP peer without its port.
func Of(req *http.Request) string {
	if r, ok := resolvedFrom(req.Context()); ok {
		return r.text
	}
	if a := parseHop(req.RemoteAddr); a.IsValid() {
		return a.String()
	}
	return req.RemoteAddr
}

// Key returns what per-address limits count req under: its client address
// (Of), an IPv6 address by its /64, since one client commonly has a whole
// /64 to pick addresses from.
func Key(req *http.Request) string {
	if r, ok := resolvedFrom(req.Context()); ok {
		return r.key
	}
	if a := parseHop(req.RemoteAddr); a.IsValid() {
		return group(a)
	}
	return req.RemoteAddr
}

// KeyFrom is Key for code that has the request's context only (a GraphQL
// operation): the key of the address the server resolved, or "" when ctx
// carries none.
func KeyFrom(ctx context.Context) string {
	if r, ok := resolvedFrom(ctx); ok {
		return r.key
	}
	return ""
}

func group(a netip.Addr) string {
	if !a.Is6() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// Middleware resolves the client address of every request and stores it
// in the request context.
func (r Resolver) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if a := r.Addr(req); a.IsValid() {
			req = req.WithContext(With(req.Context(), a))
		}
		next.ServeHTTP(w, req)
	})
}
