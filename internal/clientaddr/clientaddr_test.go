package clientaddr_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/clientaddr"
)

func resolver(t *testing.T, header clientaddr.Header, trusted ...string) clientaddr.Resolver {
	t.Helper()
	p, err := clientaddr.ParsePrefixes(trusted)
	require.NoError(t, err)
	return clientaddr.NewResolver(p, header)
}

func request(peer string, headers map[string][]string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/graphql", nil)
	r.RemoteAddr = peer
	for k, vs := range headers {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r
}

func TestXForwardedFor(t *testing.T) {
	t.Parallel()
	lb := resolver(t, clientaddr.XForwardedFor, "10.0.0.0/8", "fd00::/8", "127.0.0.1")
	xff := func(vs ...string) map[string][]string { return map[string][]string{"X-Forwarded-For": vs} }
	for _, tc := range []struct {
		name    string
		r       clientaddr.Resolver
		peer    string
		headers map[string][]string
		want    string
	}{
		{"no proxy trusted: the header is ignored", clientaddr.Resolver{}, "10.1.1.1:5000", xff("203.0.113.9"), "10.1.1.1"},
		{"untrusted peer spoofing the header", lb, "198.51.100.7:5000", xff("203.0.113.9"), "198.51.100.7"},
		{"untrusted peer spoofing a trusted address", lb, "198.51.100.7:5000", xff("10.0.0.1"), "198.51.100.7"},
		{"trusted proxy, one hop", lb, "10.0.0.2:5000", xff("203.0.113.9"), "203.0.113.9"},
		{"client forges hops left of its own", lb, "10.0.0.2:5000", xff("1.1.1.1, 2.2.2.2, 203.0.113.9"), "203.0.113.9"},
		{"chain of trusted proxies", lb, "127.0.0.1:5000", xff("203.0.113.9, 10.0.0.3, 10.9.9.9"), "203.0.113.9"},
		{"repeated header lines are one list", lb, "10.0.0.2:5000", xff("6.6.6.6", "203.0.113.9, 10.0.0.3"), "203.0.113.9"},
		{"every hop trusted: the farthest", lb, "10.0.0.2:5000", xff("10.0.0.8, 10.0.0.3"), "10.0.0.8"},
		{"trusted proxy without a header", lb, "10.0.0.2:5000", nil, "10.0.0.2"},
		{"empty header", lb, "10.0.0.2:5000", xff(""), "10.0.0.2"},
		{"garbage written by the trusted proxy", lb, "10.0.0.2:5000", xff("203.0.113.9, not-an-ip"), "10.0.0.2"},
		{"garbage left of the client is never reached", lb, "10.0.0.2:5000", xff("<script>, 203.0.113.9"), "203.0.113.9"},
		{"garbage between trusted hops stops at the hop that wrote it", lb, "10.0.0.2:5000", xff("203.0.113.9, x, 10.0.0.3"), "10.0.0.3"},
		{"hop with a port", lb, "10.0.0.2:5000", xff("203.0.113.9:4711"), "203.0.113.9"},
		{"IPv6 peer and client", lb, "[fd00::1]:5000", xff("2001:db8::7"), "2001:db8::7"},
		{"IPv6 hop in brackets with a port", lb, "[fd00::1]:5000", xff("[2001:db8::7]:4711"), "2001:db8::7"},
		{"IPv6 hop with a zone", lb, "[fd00::1]:5000", xff("fe80::1%eth0"), "fe80::1"},
		{"IPv4-mapped peer is IPv4", lb, "[::ffff:10.0.0.2]:5000", xff("203.0.113.9"), "203.0.113.9"},
		{"IPv4-mapped hop is IPv4", lb, "10.0.0.2:5000", xff("::ffff:203.0.113.9"), "203.0.113.9"},
		{"untrusted IPv6 peer", lb, "[2001:db8::1]:5000", xff("203.0.113.9"), "2001:db8::1"},
		{"Forwarded is not read when X-Forwarded-For is configured", lb, "10.0.0.2:5000", map[string][]string{"Forwarded": {"for=6.6.6.6"}}, "10.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.r.Addr(request(tc.peer, tc.headers))
			require.Equal(t, netip.MustParseAddr(tc.want), got)
		})
	}
}

func TestForwarded(t *testing.T) {
	t.Parallel()
	lb := resolver(t, clientaddr.Forwarded, "10.0.0.0/8")
	fwd := func(vs ...string) map[string][]string { return map[string][]string{"Forwarded": vs} }
	for _, tc := range []struct {
		name    string
		peer    string
		headers map[string][]string
		want    string
	}{
		{"one element", "10.0.0.2:1", fwd("for=203.0.113.9;proto=https"), "203.0.113.9"},
		{"rightmost untrusted", "10.0.0.2:1", fwd("for=6.6.6.6, for=203.0.113.9;by=10.0.0.2, for=10.0.0.5"), "203.0.113.9"},
		{"quoted IPv6 with a port", "10.0.0.2:1", fwd(`for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"case of the parameter name", "10.0.0.2:1", fwd("proto=https;For=203.0.113.9"), "203.0.113.9"},
		{"quoted comma does not split", "10.0.0.2:1", fwd(`for=203.0.113.9;ext="a,b"`), "203.0.113.9"},
		{"obfuscated node stops the walk", "10.0.0.2:1", fwd("for=203.0.113.9, for=_hidden"), "10.0.0.2"},
		{"unknown node stops the walk", "10.0.0.2:1", fwd("for=unknown"), "10.0.0.2"},
		{"element without for", "10.0.0.2:1", fwd("proto=https"), "10.0.0.2"},
		{"untrusted peer", "198.51.100.7:1", fwd("for=203.0.113.9"), "198.51.100.7"},
		{"X-Forwarded-For is not read when Forwarded is configured", "10.0.0.2:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6"}}, "10.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, netip.MustParseAddr(tc.want), lb.Addr(request(tc.peer, tc.headers)))
		})
	}
}

func TestOversizedAndOddInput(t *testing.T) {
	t.Parallel()
	lb := resolver(t, clientaddr.XForwardedFor, "10.0.0.0/8")
	long := make([]byte, 10000)
	for i := range long {
		long[i] = '1'
	}
	for _, v := range []string{string(long), ",,,,", " , ", "1.2.3", "[::1", "::1]", "1.2.3.4:notaport:1", "\x00\x01"} {
		got := lb.Addr(request("10.0.0.2:1", map[string][]string{"X-Forwarded-For": {v}}))
		require.Equal(t, netip.MustParseAddr("10.0.0.2"), got, "header %q", v)
	}
	// A RemoteAddr that is not host:port (a unix socket, a made-up test
	// request) gives no address, and Of falls back to the text.
	r := request("@", nil)
	require.False(t, lb.Addr(r).IsValid())
	require.Equal(t, "@", clientaddr.Of(r))
}

func TestParsePrefixes(t *testing.T) {
	t.Parallel()
	p, err := clientaddr.ParsePrefixes([]string{"10.0.0.0/8", "192.0.2.7", "fd00::/8", "::1", "::ffff:172.16.0.0/108", "10.1.2.3/8"})
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.0/8", "192.0.2.7/32", "fd00::/8", "::1/128", "172.16.0.0/12", "10.1.2.3/8"}, strs(p))
	// A prefix with host bits set still means its network.
	r := clientaddr.NewResolver(p, "")
	require.Equal(t, "203.0.113.9", r.Addr(request("10.200.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.9"}})).String())

	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0.1-10.0.0.9", "fe80::1%eth0", "*"} {
		_, err := clientaddr.ParsePrefixes([]string{bad})
		require.Error(t, err, bad)
	}
	_, err = clientaddr.ParseHeader("X-Real-IP")
	require.Error(t, err)
	h, err := clientaddr.ParseHeader(" Forwarded ")
	require.NoError(t, err)
	require.Equal(t, clientaddr.Forwarded, h)
}

func TestMiddlewareStoresTheAddress(t *testing.T) {
	t.Parallel()
	lb := resolver(t, clientaddr.XForwardedFor, "127.0.0.0/8")
	var got string
	h := lb.Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = clientaddr.Of(r) }))
	h.ServeHTTP(httptest.NewRecorder(), request("127.0.0.1:9", map[string][]string{"X-Forwarded-For": {"2001:db8::1"}}))
	require.Equal(t, "2001:db8::1", got)
	h.ServeHTTP(httptest.NewRecorder(), request("192.0.2.1:9", map[string][]string{"X-Forwarded-For": {"2001:db8::1"}}))
	require.Equal(t, "192.0.2.1", got)
}

func strs(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// Key counts an IPv4 client alone and an IPv6 client by its /64, through
// the resolved address when the server resolved one.
func TestKeyGroupsIPv6ByItsSlash64(t *testing.T) {
	t.Parallel()
	for peer, want := range map[string]string{
		"192.0.2.7:5000":                  "192.0.2.7",
		"[2001:db8:1:2:aaaa::1]:5000":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:ffff::9]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:443":           "2001:db8:1:3::/64",
		"[::ffff:192.0.2.8]:80":           "192.0.2.8",
		"not an address":                  "not an address",
	} {
		require.Equal(t, want, clientaddr.Key(request(peer, nil)), peer)
	}
	r := request("10.0.0.1:80", map[string][]string{"X-Forwarded-For": {"2001:db8:9::5"}})
	var got string
	resolver(t, clientaddr.XForwardedFor, "10.0.0.0/8").Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got = clientaddr.Key(r)
	})).ServeHTTP(httptest.NewRecorder(), r)
	require.Equal(t, "2001:db8:9::/64", got)
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A peer is read from every form a RemoteAddr or a hop takes, and the TCP
// peer's "address:port" without an allocation.
func TestPeerForms(t *testing.T) {
	var r clientaddr.Resolver
	for peer, want := range map[string]string{
		"192.0.2.7:5000":        "192.0.2.7",
		"192.0.2.7":             "192.0.2.7",
		"192.0.2.7:notaport":    "192.0.2.7",
		"192.0.2.7:99999":       "192.0.2.7",
		"[2001:db8::1]:443":     "2001:db8::1",
		"[2001:db8::1]":         "2001:db8::1",
		"2001:db8::1":           "2001:db8::1",
		"[fe80::1%eth0]:443":    "fe80::1",
		"fe80::1%eth0":          "fe80::1",
		"[::ffff:192.0.2.8]:80": "192.0.2.8",
		"::ffff:192.0.2.8":      "192.0.2.8",
		"[192.0.2.9]:80":        "192.0.2.9",
		" 192.0.2.10:1 ":        "192.0.2.10",
		"::1:80":                "::1:80",
		"1.2.3.4:5:6":           "invalid IP",
		"[2001:db8::1]:443:1":   "invalid IP",
		"example.com:80":        "invalid IP",
	} {
		require.Equal(t, want, r.Addr(request(peer, nil)).String(), peer)
	}
	req := request("127.0.0.1:54321", nil)
	require.Zero(t, testing.AllocsPerRun(100, func() { r.Addr(req) }))
}

// With puts an address in its context with one allocation besides its
// text's.
func TestWithIsOneAllocationAndTheText(t *testing.T) {
	bg, a := context.Background(), netip.MustParseAddr("192.0.2.7")
	require.Equal(t, 2.0, testing.AllocsPerRun(100, func() { sink = clientaddr.With(bg, a) }))
	got, ok := clientaddr.From(sink)
	require.True(t, ok)
	require.Equal(t, a, got)
	require.Equal(t, "192.0.2.7", clientaddr.KeyFrom(sink))
}

// sink keeps what an allocation count makes on the heap, as a request does.
var sink context.Context
