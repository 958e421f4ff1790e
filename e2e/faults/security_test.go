package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
)

// Security findings of an attacker without a token, against the real
// binary: each test shows one refusal the server makes, from outside.

// answer is one HTTP answer of the binary, headers included.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// send makes one request and reads the whole answer; it fails the test
// only when no answer came.
func send(t *testing.T, method, url string, header http.Header, body []byte) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	// Bounded by ctx alone: a 1 MB body under -race on a loaded machine
	// took longer than quickClient's 5 s once.
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// errorCodes returns the extensions.code of each error of a GraphQL
// answer, and whether it carried data.
func errorCodes(t *testing.T, a answer) (codes []string, data bool) {
	t.Helper()
	var out struct {
		Data   json.RawMessage `json:"data"`
		Errors []gqlError      `json:"errors"`
	}
	require.NoError(t, json.Unmarshal(a.Body, &out), "status %d, body %.300s", a.Status, a.Body)
	for _, e := range out.Errors {
		codes = append(codes, e.code())
	}
	return codes, len(out.Data) > 0 && string(out.Data) != "null"
}

// A request whose Authorization header does not verify is refused with 401,
// WWW-Authenticate: Bearer and UNAUTHENTICATED, whatever it asks for: a
// public read, a mutation, a websocket upgrade or an SSE stream. It is never
// answered as if no token had been sent; no token at all still reads the
// public catalogue.
func TestBadBearerTokenIsRefusedWhateverItAsks(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	p := s.start("a")
	s.createProduct(p, "TOKEN-1", 5, 0)
	product := `{"query":"{ product(sku: \"TOKEN-1\") { sku stock { available } } }"}`
	reserve := `{"query":"mutation { reserve(input: {sku: \"TOKEN-1\", quantity: 1}) { userErrors { code } } }"}`
	jsonHeader := func(authz string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		if authz != "" {
			h.Set("Authorization", authz)
		}
		return h
	}

	anon := send(t, http.MethodPost, p.URL+"/graphql", jsonHeader(""), []byte(product))
	codes, data := errorCodes(t, anon)
	require.Equal(t, http.StatusOK, anon.Status)
	require.Empty(t, codes)
	require.True(t, data, "the public catalogue answers an anonymous caller")

	for name, authz := range map[string]string{
		"garbage":          "Bearer garbage",
		"not a JWT":        "Bearer not.a.jwt",
		"other scheme":     "Basic YWxpY2U6cHc=",
		"empty bearer":     "Bearer ",
		"forged signature": "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMH0.c2lnbmF0dXJlLW9mLWFub3RoZXItc2VjcmV0",
	} {
		t.Run(name, func(t *testing.T) {
			for what, body := range map[string]string{"public query": product, "mutation": reserve} {
				a := send(t, http.MethodPost, p.URL+"/graphql", jsonHeader(authz), []byte(body))
				require.Equal(t, http.StatusUnauthorized, a.Status, "%s: %s", what, a.Body)
				require.True(t, strings.HasPrefix(a.Header.Get("WWW-Authenticate"), "Bearer"), "%s: %q", what, a.Header.Get("WWW-Authenticate"))
				codes, data := errorCodes(t, a)
				require.Equal(t, []string{"UNAUTHENTICATED"}, codes, what)
				require.False(t, data, "%s: nothing ran", what)
			}
			get := send(t, http.MethodGet, p.URL+"/graphql?query="+url.QueryEscape(`{ product(sku: "TOKEN-1") { sku } }`), http.Header{"Authorization": {authz}}, nil)
			require.Equal(t, http.StatusUnauthorized, get.Status, "GET: %s", get.Body)

			sse := jsonHeader(authz)
			sse.Set("Accept", "text/event-stream")
			a := send(t, http.MethodPost, p.URL+"/graphql", sse, []byte(`{"query":"subscription { stockChanged(skus: [\"TOKEN-1\"]) { sku } }"}`))
			require.Equal(t, http.StatusUnauthorized, a.Status, "SSE: %s", a.Body)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(p.URL, "http")+"/graphql", &websocket.DialOptions{
				Subprotocols: []string{wsclient.TransportWS},
				HTTPHeader:   http.Header{"Authorization": {authz}},
			})
			if conn != nil {
				_ = conn.CloseNow()
			}
			if resp != nil && resp.Body != nil {
				_ = resp.Body.Close()
			}
			require.Error(t, err, "the websocket is not upgraded")
			require.NotNil(t, resp)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "websocket upgrade")
		})
	}
	// The same token in connection_init closes the socket with 4403.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(p.URL, "http")+"/graphql", wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer garbage"}})
	require.Equal(t, websocket.StatusCode(4403), websocket.CloseStatus(err), "%v", err)

	require.Equal(t, 5, s.stockOf("TOKEN-1").Available, "nothing was reserved")
}

// signJWT signs header and payload exactly as written with the harness'
// secret, so a test can send tokens Mint would never make.
func signJWT(header, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	unsigned := enc([]byte(header)) + "." + enc([]byte(payload))
	mac := hmac.New(sha256.New, []byte(testSecret))
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc(mac.Sum(nil))
}

// With the default configuration a token lives at most 24 hours, whatever
// its exp says, and a token that names a claim twice is refused: a forged
// "role" repeat does not make an admin. Both get 401; a day's token is
// served.
func TestTokensLiveNoLongerThanTheServerAllows(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	p := s.start("a")
	now := time.Now()
	const hs256 = `{"alg":"HS256","typ":"JWT"}`
	claims := func(extra string, iat, exp time.Time) string {
		c := `{"iss":"dropline","sub":"mallory"` + extra + `,"exp":` + strconv.FormatInt(exp.Unix(), 10)
		if !iat.IsZero() {
			c += `,"iat":` + strconv.FormatInt(iat.Unix(), 10)
		}
		return c + `}`
	}
	create := []byte(`{"query":"mutation { createProduct(input: {sku: \"FORGED-1\", name: \"x\", stock: 1, price: {amount: 1, currency: \"EUR\"}}) { userErrors { code } } }"}`)
	as := func(token string) answer {
		return send(t, http.MethodPost, p.URL+"/graphql", http.Header{
			"Content-Type": {"application/json"}, "Authorization": {"Bearer " + token},
		}, create)
	}

	for name, token := range map[string]string{
		"exp in the year 9999":    signJWT(hs256, claims(`,"role":"admin"`, time.Time{}, time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))),
		"issued for 25 hours":     signJWT(hs256, claims(`,"role":"admin"`, now, now.Add(25*time.Hour))),
		"role twice, admin last":  signJWT(hs256, claims(`,"role":"buyer","role":"admin"`, now, now.Add(time.Hour))),
		"role twice, admin first": signJWT(hs256, claims(`,"role":"admin","role":"buyer"`, now, now.Add(time.Hour))),
	} {
		a := as(token)
		require.Equal(t, http.StatusUnauthorized, a.Status, "%s: %s", name, a.Body)
		codes, _ := errorCodes(t, a)
		require.Equal(t, []string{"UNAUTHENTICATED"}, codes, name)
	}
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM products WHERE sku = 'FORGED-1'`), "no forged admin created a product")

	a := as(signJWT(hs256, claims(`,"role":"admin"`, now, now.Add(23*time.Hour))))
	require.Equal(t, http.StatusOK, a.Status, "a token of less than a day is served: %s", a.Body)
	codes, _ := errorCodes(t, a)
	require.Empty(t, codes)
	require.Equal(t, 1, s.scalar(`SELECT count(*)::int FROM products WHERE sku = 'FORGED-1'`))
}

// apqBody is a POST body carrying query with its correct sha256Hash.
func apqBody(query string, withQuery bool) []byte {
	sum := sha256.Sum256([]byte(query))
	m := map[string]any{"extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(sum[:])}}}
	if withQuery {
		m["query"] = query
	}
	b, _ := json.Marshal(m)
	return b
}

// apqFootprint counts the persisted queries in Redis and what they use
// (MEMORY USAGE, the key's overhead included).
func (s *system) apqFootprint(t *testing.T) (keys int, bytes int64) {
	t.Helper()
	ctx := context.Background()
	iter := s.RDB.Scan(ctx, 0, keyPrefix+"apq:*", 1000).Iterator()
	for iter.Next(ctx) {
		n, err := s.RDB.MemoryUsage(ctx, iter.Val()).Result()
		require.NoError(t, err)
		keys++
		bytes += n
	}
	require.NoError(t, iter.Err())
	return keys, bytes
}

// Anonymous clients cannot fill Redis through automatic persisted
// queries: 20 POSTs of ~1 MiB of junk with their correct hash each get
// GRAPHQL_PARSE_FAILED and leave no key; 64 distinct valid 30 KiB queries
// from one address all run, but only about 1 MiB of them is registered;
// another address still registers.
func TestJunkPersistedQueriesLeaveNothingInRedis(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	p := s.start("a")
	header := http.Header{"Content-Type": {"application/json"}}

	junk := make([]byte, 1_000_000)
	for i := range 20 {
		for j := range junk {
			junk[j] = 'a' + byte((i+j)%26)
		}
		a := send(t, http.MethodPost, p.URL+"/graphql", header, apqBody(string(junk), true))
		codes, _ := errorCodes(t, a)
		require.Equal(t, []string{"GRAPHQL_PARSE_FAILED"}, codes, "junk %d", i)
	}
	keys, bytes := s.apqFootprint(t)
	require.Zero(t, keys, "junk registered nothing (%d bytes)", bytes)

	query := func(i int) string {
		return fmt.Sprintf("{ __typename } # %d %s", i, strings.Repeat("x", 30<<10))
	}
	for i := range 64 {
		a := send(t, http.MethodPost, p.URL+"/graphql", header, apqBody(query(i), true))
		codes, data := errorCodes(t, a)
		require.Empty(t, codes, "query %d runs", i)
		require.True(t, data)
	}
	keys, bytes = s.apqFootprint(t)
	// Each is charged its 30,740 bytes and 200 for its key: 33 fit in 1 MiB.
	require.Equal(t, 33, keys, "one address registers about 1 MiB of queries")
	require.Less(t, bytes, int64(1<<20)*5/4, "what Redis keeps for them")

	from2 := loopbackClient(t, "127.0.0.2")
	r := postRaw(context.Background(), from2, p.URL, "", "application/json", apqBody(query(64), true))
	require.NoError(t, r.Err)
	require.Empty(t, r.Errors)
	keys2, _ := s.apqFootprint(t)
	require.Equal(t, keys+1, keys2, "another address has a budget of its own")
	t.Logf("FIGURES apq: junk_keys=0 junk_bytes=0 valid_sent=64 registered=%d registered_bytes=%d", keys, bytes)
}

// slowBody is one socket that sent its headers, declaring a body of a
// million bytes, and then trickles a byte now and then.
type slowBody struct {
	status int           // the answer's status, 0 while none came
	closed time.Duration // when the server closed it, since the start
}

// Slow bodies are not held open without end: 200 sockets from one address
// send headers with Content-Length: 1000000 and then a byte every 2 s.
// With DROPLINE_REQUESTS_PER_ADDR=50, 150 are answered 429 at once; the 50
// admitted are answered 408 and closed once the default 10 s to send a
// body have passed. Meanwhile another address is served.
func TestSlowBodiesAreCutOffAndCappedPerAddress(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	s.Env["DROPLINE_REQUESTS_PER_ADDR"] = "50"
	p := s.start("a")
	addr := strings.TrimPrefix(p.URL, "http://")
	const sockets = 200
	start := time.Now()
	results := make(chan struct {
		i int
		r slowBody
	}, sockets)
	stop := make(chan struct{})
	defer close(stop)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 5 * time.Second}
	for i := range sockets {
		conn, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = io.WriteString(conn, "POST /graphql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
		require.NoError(t, err)
		go func() { // the trickle, bounded by the test
			tick := time.NewTicker(2 * time.Second)
			defer tick.Stop()
			for range 15 {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := io.WriteString(conn, " "); err != nil {
					return
				}
			}
		}()
		go func() {
			var r slowBody
			_ = conn.SetReadDeadline(time.Now().Add(40 * time.Second))
			br := bufio.NewReader(conn)
			if resp, err := http.ReadResponse(br, nil); err == nil {
				r.status = resp.StatusCode
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			if _, err := br.ReadByte(); errors.Is(err, io.EOF) {
				r.closed = time.Since(start)
			}
			results <- struct {
				i int
				r slowBody
			}{i, r}
		}()
	}

	// Another address is served meanwhile.
	for range 5 {
		r := post(context.Background(), quickClient, p.URL, "", `{ __typename }`, nil)
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusOK, r.Status)
		time.Sleep(500 * time.Millisecond)
	}

	byStatus := map[int]int{}
	var cutAt []time.Duration
	openAfter15s := 0
	for range sockets {
		select {
		case res := <-results:
			byStatus[res.r.status]++
			if res.r.closed == 0 || res.r.closed > 15*time.Second {
				openAfter15s++
			}
			if res.r.status == http.StatusRequestTimeout {
				cutAt = append(cutAt, res.r.closed)
			}
		case <-time.After(45 * time.Second):
			t.Fatalf("sockets still waiting after 45 s: %v so far", byStatus)
		}
	}
	t.Logf("FIGURES slow bodies: sockets=%d refused_429=%d cut_408=%d open_after_15s=%d", sockets, byStatus[http.StatusTooManyRequests], byStatus[http.StatusRequestTimeout], openAfter15s)
	require.Equal(t, sockets-50, byStatus[http.StatusTooManyRequests], "over the cap: refused at once")
	require.Equal(t, 50, byStatus[http.StatusRequestTimeout], "admitted: cut off when their time to send the body ran out")
	require.Zero(t, openAfter15s, "no socket is open 15 s after it started")
	for _, at := range cutAt {
		require.Greater(t, at, 9*time.Second, "cut by the 10 s bound, not before")
	}
}

// adminURL returns the base URL of p's admin listener, read from its log.
func adminURL(t *testing.T, p *proc) string {
	t.Helper()
	for _, line := range strings.Split(p.log.String(), "\n") {
		var m struct {
			AdminAddr string `json:"admin_addr"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.AdminAddr != "" {
			return "http://" + m.AdminAddr
		}
	}
	t.Fatalf("dropline %s logged no admin_addr:\n%s", p.Name, p.log.String())
	return ""
}

// With Redis down, the public /readyz answers 503 and names nothing: no
// dependency, no internal address. The reason goes to the log and to the
// admin listener's /readyz.
func TestReadyzTellsReasonsOnlyToTheAdminListener(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_ADMIN_ADDR"] = "127.0.0.1:0"
	p := s.start("a")
	admin := adminURL(t, p)
	_, redisPort, err := net.SplitHostPort(s.Redis.Addr)
	require.NoError(t, err)

	s.Redis.Stop()
	public := send(t, http.MethodGet, p.URL+"/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, public.Status)
	require.JSONEq(t, `{"status":"unavailable"}`, string(public.Body))
	require.NotContains(t, string(public.Body), redisPort)

	reasons := send(t, http.MethodGet, admin+"/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, reasons.Status)
	var body struct {
		Failed map[string]string `json:"failed"`
	}
	require.NoError(t, json.Unmarshal(reasons.Body, &body), string(reasons.Body))
	require.NotEmpty(t, body.Failed["redis"], "the admin listener names the failure: %s", reasons.Body)
	t.Logf("public /readyz: %s; admin /readyz: %s", public.Body, reasons.Body)
	eventually(t, 5*time.Second, "the log names the failure", func() (bool, string) {
		for _, line := range strings.Split(p.log.String(), "\n") {
			var m struct {
				Message string            `json:"message"`
				Failed  map[string]string `json:"failed"`
			}
			if json.Unmarshal([]byte(line), &m) == nil && m.Message == "not ready" && m.Failed["redis"] != "" {
				return true, ""
			}
		}
		return false, "no \"not ready\" line naming Redis"
	})

	require.NoError(t, s.Redis.Start())
	s.waitReady(p, 30*time.Second)
}

// A dev-mode server answers only requests for a loopback name: a page that
// rebinds its own name to 127.0.0.1 (DNS rebinding) reaches the port with
// Host: its name, and is refused before it can mint a token or run an
// admin mutation signed with the public dev secret. localhost,
// 127.0.0.1 and [::1] are served.
func TestDevModeAnswersOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_DEV"] = "1"
	s.Env["DROPLINE_JWT_SECRET"] = "" // the public development secret
	p := s.start("dev")
	_, port, err := net.SplitHostPort(strings.TrimPrefix(p.URL, "http://"))
	require.NoError(t, err)
	public, err := auth.NewIssuer([]byte(config.DevJWTSecret))
	require.NoError(t, err)
	admin, err := public.Mint("rebinder", true, time.Hour)
	require.NoError(t, err)

	as := func(host, path, authz, body string) answer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		if authz != "" {
			req.Header.Set("Authorization", "Bearer "+authz)
		}
		resp, err := quickClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}
	create := `{"query":"mutation { createProduct(input: {sku: \"REBOUND-1\", name: \"x\", stock: 1, price: {amount: 1, currency: \"EUR\"}}) { userErrors { code } } }"}`

	for _, host := range []string{"rebind.example:" + port, "rebind.example", "127.0.0.1.nip.io:" + port} {
		a := as(host, "/dev/token", "", `{"user":"rebinder"}`)
		require.Equal(t, http.StatusForbidden, a.Status, "%s /dev/token: %s", host, a.Body)
		require.NotContains(t, string(a.Body), "token\":", host)
		a = as(host, "/graphql", admin, create)
		require.Equal(t, http.StatusForbidden, a.Status, "%s /graphql: %s", host, a.Body)
	}
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM products WHERE sku = 'REBOUND-1'`), "no rebinding page created a product")

	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port} {
		a := as(host, "/dev/token", "", `{"user":"developer"}`)
		require.Equal(t, http.StatusOK, a.Status, "%s /dev/token: %s", host, a.Body)
	}
	a := as("localhost:"+port, "/graphql", admin, create)
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Body)
	require.Equal(t, 1, s.scalar(`SELECT count(*)::int FROM products WHERE sku = 'REBOUND-1'`))
}

// serveFails runs `dropline serve`, expecting it to refuse to start, and
// returns what it wrote.
func (s *system) serveFails(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve")
	cmd.Env = s.environ()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "dropline serve did not fail (%v):\n%s", err, out)
	require.NotEqual(t, 0, exit.ExitCode())
	return string(out)
}

// Dropline refuses to serve from a Redis that evicts keys, on every
// topology: at start (a single server, a Sentinel primary, any master of
// a cluster) with one line naming the server and the setting, and when a
// server's policy turns evicting while it serves, from its next
// connection on, until it is noeviction again. A server that does not let
// the policy be read is served, with a warning.
func TestServeRefusesAnEvictingRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const warning = "cannot read Redis' maxmemory-policy"

	t.Run("single, at start and on reconnect", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t)
		require.NoError(t, s.RDB.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
		out := s.serveFails(t)
		require.Contains(t, out, "maxmemory-policy allkeys-lru")
		require.Contains(t, out, s.Redis.Addr)
		require.Contains(t, out, "set maxmemory-policy noeviction")
		t.Logf("refused at start: %s", strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))

		require.NoError(t, s.RDB.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		p := s.start("a")
		s.createProduct(p, "EVICT-1", 5, 0)
		require.NoError(t, s.RDB.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
		require.NoError(t, s.RDB.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err())
		eventually(t, 10*time.Second, "not ready while Redis evicts", func() (bool, string) {
			a := send(t, http.MethodGet, p.URL+"/readyz", nil, nil)
			return a.Status == http.StatusServiceUnavailable, fmt.Sprint(a.Status)
		})
		r := post(ctx, quickClient, p.URL, s.token("buyer", false), reserveMutation, map[string]any{"input": map[string]any{"sku": "EVICT-1", "quantity": 1}})
		require.NoError(t, r.Err)
		require.NotContains(t, string(r.Data), `"token"`, "no hold is made on an evicting Redis: %s %v", r.Data, r.Errors)
		require.Contains(t, p.log.String(), `"maxmemory_policy":"volatile-lru"`)

		require.NoError(t, s.RDB.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		s.waitReady(p, 30*time.Second)
		require.Equal(t, 5, s.stockOf("EVICT-1").Available)
		require.NotContains(t, p.log.String(), warning)
	})

	t.Run("CONFIG renamed", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t)
		s.RedisVia = testenv.StartServer(t, "--rename-command", "CONFIG", "").Addr
		p := s.start("a")
		s.createProduct(p, "EVICT-2", 5, 0)
		require.Equal(t, 1, strings.Count(p.log.String(), warning), "warned once:\n%s", p.log.String())
	})

	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t)
		set := testenv.StartReplicated(t, time.Second)
		s.Env["REDIS_URL"] = set.URL()
		primary := redis.NewClient(&redis.Options{Addr: set.Primary.Addr})
		t.Cleanup(func() { _ = primary.Close() })
		require.NoError(t, primary.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err())
		out := s.serveFails(t)
		require.Contains(t, out, "maxmemory-policy allkeys-lfu")
		require.Contains(t, out, set.Primary.Addr)

		require.NoError(t, primary.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		p := s.start("a")
		require.NotContains(t, p.log.String(), warning, "sentinels are not asked for a policy")
	})

	t.Run("cluster, every master", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t)
		c, err := testenv.StartCluster(t.TempDir())
		require.NoError(t, err)
		t.Cleanup(c.Stop)
		s.Env["REDIS_URL"] = "redis-cluster://" + strings.Join(c.Addrs, ",")
		last := redis.NewClient(&redis.Options{Addr: c.Addrs[2]})
		t.Cleanup(func() { _ = last.Close() })
		require.NoError(t, last.ConfigSet(ctx, "maxmemory-policy", "allkeys-random").Err())
		out := s.serveFails(t)
		require.Contains(t, out, "maxmemory-policy allkeys-random")
		require.Contains(t, out, c.Addrs[2], "the master that evicts is named, not the seed")
	})
}
