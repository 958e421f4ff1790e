package faults

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
)

// Hostile and broken requests against the real binary (G9). Each gets a
// clear typed error or is cut off; nothing panics (the server log is
// checked when the test ends) and nothing changes state: the stock, the
// reservations and the ledger are the same afterwards.
func TestAbuse(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	p := s.start("a")
	const sku = "ABUSE-1"
	s.createProduct(p, sku, 10, 0)
	before := s.stockOf(sku)
	buyer := s.token("abuser", false)
	ctx := context.Background()
	client := &http.Client{Timeout: 20 * time.Second}
	var cases atomic.Int64

	// refused requires a typed refusal: a JSON body whose errors all carry a code.
	refused := func(t *testing.T, r gqlResult, statuses ...int) []string {
		t.Helper()
		cases.Add(1)
		require.NoError(t, r.Err)
		require.Contains(t, statuses, r.Status, "status")
		require.NotEmpty(t, r.Errors, "errors")
		var codes []string
		for _, e := range r.Errors {
			require.NotEmpty(t, e.code(), "error without a code: %s", e.Message)
			require.NotEqual(t, "INTERNAL", e.code(), "internal error: %s", e.Message)
			codes = append(codes, e.code())
		}
		return codes
	}
	// userErr requires a 200 whose mutation payload carries one userError.
	userErr := func(t *testing.T, r gqlResult, field string) string {
		t.Helper()
		cases.Add(1)
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusOK, r.Status)
		if len(r.Errors) > 0 {
			require.NotEqual(t, "INTERNAL", r.Errors[0].code(), r.Errors[0].Message)
			return r.Errors[0].code() // refused before the resolver (validation)
		}
		var out map[string]struct {
			Reservation any         `json:"reservation"`
			UserErrors  []userError `json:"userErrors"`
		}
		require.NoError(t, json.Unmarshal(r.Data, &out))
		require.Nil(t, out[field].Reservation)
		require.Len(t, out[field].UserErrors, 1)
		return out[field].UserErrors[0].Code
	}
	// Each hostile request comes from a principal of its own, so the
	// per-principal mutation rate limit does not answer in the checks' place.
	var principals atomic.Int64
	fresh := func() string { return s.token(fmt.Sprintf("abuser-%d", principals.Add(1)), false) }
	reserve := func(token string, input map[string]any) gqlResult {
		if token == buyer {
			token = fresh()
		}
		return post(ctx, client, p.URL, token, reserveMutation, map[string]any{"input": input})
	}

	t.Run("depth bomb", func(t *testing.T) {
		q := "query {" + strings.Repeat(" product(sku: \"ABUSE-1\") {", 2000) + strings.Repeat("}", 2001)
		refused(t, post(ctx, client, p.URL, "", q, nil), 200, 400, 422)
		deep := `query { myReservations { edges { node { product { stock { sku } } } } } }`
		r := post(ctx, client, p.URL, buyer, deep, nil)
		require.Empty(t, r.Errors, "a legitimate nesting is served")
		bomb := "query { node(id: \"x\") {" + strings.Repeat(" ... on Reservation { product { stock { id } } }", 1) +
			strings.Repeat(" ... on Product { id }", 3000) + "} }"
		refused(t, post(ctx, client, p.URL, "", bomb, nil), 200, 400, 422)
	})

	t.Run("alias bomb of 1000 reserves", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("mutation {")
		for i := range 1000 {
			fmt.Fprintf(&b, " r%d: reserve(input: {sku: %q, quantity: 1}) { userErrors { code } }", i, sku)
		}
		b.WriteString(" }")
		codes := refused(t, post(ctx, client, p.URL, buyer, b.String(), nil), 200, 400, 422)
		t.Logf("alias bomb refused with %v", codes)
		// Small enough to parse: the mutation-field limit refuses it whole.
		b.Reset()
		b.WriteString("mutation {")
		for i := range 50 {
			fmt.Fprintf(&b, " r%d: reserve(input: {sku: %q, quantity: 1}) { userErrors { code } }", i, sku)
		}
		b.WriteString(" }")
		codes = refused(t, post(ctx, client, p.URL, fresh(), b.String(), nil), 200, 400, 422)
		require.Contains(t, codes, "TOO_MANY_MUTATIONS")
	})

	t.Run("alias bomb of 1000 reads", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("query {")
		for i := range 1000 {
			fmt.Fprintf(&b, " p%d: product(sku: %q) { stock { available held sold total } }", i, sku)
		}
		b.WriteString(" }")
		refused(t, post(ctx, client, p.URL, "", b.String(), nil), 200, 400, 422)
	})

	t.Run("huge variables", func(t *testing.T) {
		r := reserve(buyer, map[string]any{"sku": strings.Repeat("A", 900_000), "quantity": 1})
		require.Equal(t, "INVALID_INPUT", userErr(t, r, "reserve"))
		// 50,000 unknown fields in the input object: refused by validation.
		input := map[string]any{"sku": sku, "quantity": 1}
		for i := range 50_000 {
			input[fmt.Sprintf("f%d", i)] = i
		}
		refused(t, reserve(buyer, input), 200, 400, 413, 422)
		// A 100,000-element list where an Int is expected.
		list := make([]int, 100_000)
		refused(t, reserve(buyer, map[string]any{"sku": sku, "quantity": list}), 200, 400, 413, 422)
	})

	t.Run("10 MB body", func(t *testing.T) {
		body := append([]byte(`{"query":"query { __typename }","variables":{"x":"`), make([]byte, 10<<20)...)
		for i := len(body) - 10<<20; i < len(body); i++ {
			body[i] = 'a'
		}
		body = append(body, `"}}`...)
		r := postRaw(ctx, client, p.URL, "", "application/json", body)
		if r.Err != nil { // cut off mid-upload is an acceptable refusal
			cases.Add(1)
			return
		}
		cases.Add(1)
		require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	})

	t.Run("invalid UTF-8", func(t *testing.T) {
		r := postRaw(ctx, client, p.URL, fresh(), "application/json", []byte("{\"query\":\"mutation { reserve(input: {sku: \\\"\xff\xfe\\\", quantity: 1}) { userErrors { code } } }\"}"))
		if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 {
			require.Equal(t, "INVALID_INPUT", userErr(t, r, "reserve"))
		} else {
			refused(t, r, 200, 400, 422)
		}
		r = reserve(s.token("abuser-0", false), map[string]any{"sku": sku, "quantity": 1, "holdSeconds": 1, "idempotencyKey": "\xff\xfe\xfd"})
		// encoding/json replaces invalid bytes with U+FFFD; send them raw too.
		raw := []byte("{\"query\":" + mustJSON(reserveMutation) + ",\"variables\":{\"input\":{\"sku\":\"ABUSE-1\",\"quantity\":1,\"holdSeconds\":1,\"idempotencyKey\":\"\xff\xfe\"}}}")
		r2 := postRaw(ctx, client, p.URL, fresh(), "application/json", raw)
		for _, r := range []gqlResult{r, r2} {
			if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 {
				var out struct {
					Reserve struct {
						Reservation *struct {
							Token string `json:"token"`
						} `json:"reservation"`
					} `json:"reserve"`
				}
				require.NoError(t, json.Unmarshal(r.Data, &out))
				if out.Reserve.Reservation != nil {
					// A replacement-character key is a valid key: undo the hold.
					post(ctx, client, p.URL, s.token("abuser-0", false), cancelMutation, map[string]any{"token": out.Reserve.Reservation.Token})
				}
				cases.Add(1)
				continue
			}
			refused(t, r, 200, 400, 422)
		}
	})

	t.Run("quantities", func(t *testing.T) {
		for _, q := range []any{-1, 0, 101, 2147483647} {
			require.Equal(t, "INVALID_INPUT", userErr(t, reserve(buyer, map[string]any{"sku": sku, "quantity": q}), "reserve"), "quantity %v", q)
		}
		// Out of Int's 32-bit range: gqlgen accepts up to int64, the engine refuses.
		for _, q := range []any{int64(1) << 40, int64(-1) << 40} {
			r := reserve(buyer, map[string]any{"sku": sku, "quantity": q})
			if len(r.Errors) == 0 {
				require.Equal(t, "INVALID_INPUT", userErr(t, r, "reserve"), "quantity %v", q)
			} else {
				refused(t, r, 200, 400, 422)
			}
		}
		for _, q := range []any{1.5, "abc", nil, map[string]any{"x": 1}} {
			refused(t, reserve(buyer, map[string]any{"sku": sku, "quantity": q}), 200, 400, 422)
		}
		for _, h := range []any{0, -5, 3601, 2147483647} {
			require.Equal(t, "INVALID_INPUT", userErr(t, reserve(buyer, map[string]any{"sku": sku, "quantity": 1, "holdSeconds": h}), "reserve"), "holdSeconds %v", h)
		}
		require.Equal(t, "INVALID_INPUT", userErr(t, reserve(buyer, map[string]any{"sku": sku, "quantity": 1,
			"idempotencyKey": strings.Repeat("k", 129)}), "reserve"))
	})

	t.Run("unknown and invalid SKUs", func(t *testing.T) {
		require.Equal(t, "NOT_FOUND", userErr(t, reserve(buyer, map[string]any{"sku": "NO-SUCH-SKU", "quantity": 1}), "reserve"))
		for _, bad := range []string{"", "a b", "../../etc", "x{p00}y", strings.Repeat("z", 65), "é"} {
			require.Equal(t, "INVALID_INPUT", userErr(t, reserve(buyer, map[string]any{"sku": bad, "quantity": 1}), "reserve"), "sku %q", bad)
		}
	})

	t.Run("malformed and forged reservation tokens", func(t *testing.T) {
		for _, tok := range []string{"", "x", "r07.", "r99.aaaaaaaaaaaaaaaaaaaaaaaaaa", "r-1.aaaaaaaaaaaaaaaaaaaaaaaaaa",
			strings.Repeat("r", 10_000), "r07.AAAAAAAAAAAAAAAAAAAAAAAAAA", "r07.aaaaaaaaaaaaaaaaaaaaaaaaa!", "r07.aaaaaaaaaaaaaaaaaaaaaaaaa\x00"} {
			for _, m := range []struct{ field, query string }{{"commit", commitMutation}, {"cancel", cancelMutation}} {
				code := userErr(t, post(ctx, client, p.URL, fresh(), m.query, map[string]any{"token": tok}), m.field)
				require.Equal(t, "INVALID_INPUT", code, "%s %q", m.field, tok)
			}
		}
		forged := "r07.abcdefghijklmnopqrstuvwxyz" // well formed, never issued
		for _, m := range []struct{ field, query string }{{"commit", commitMutation}, {"cancel", cancelMutation}} {
			require.Equal(t, "NOT_FOUND", userErr(t, post(ctx, client, p.URL, fresh(), m.query, map[string]any{"token": forged[:30]}), m.field))
		}
	})

	t.Run("bad JWTs", func(t *testing.T) {
		expiredIss := s.Issuer.WithClock(func() time.Time { return time.Now().Add(-3 * time.Hour) })
		expired, err := expiredIss.Mint("abuser", false, time.Hour)
		require.NoError(t, err)
		other, err := auth.NewIssuer([]byte(strings.Repeat("w", 40)))
		require.NoError(t, err)
		wrong, err := other.Mint("abuser", true, time.Hour)
		require.NoError(t, err)
		b64 := base64.RawURLEncoding.EncodeToString
		none := b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
			b64([]byte(fmt.Sprintf(`{"iss":"dropline","sub":"abuser","role":"admin","exp":%d}`, time.Now().Add(time.Hour).Unix()))) + "."
		parts := strings.Split(buyer, ".")
		tampered := parts[0] + "." + b64([]byte(fmt.Sprintf(`{"iss":"dropline","sub":"abuser","role":"admin","exp":%d}`, time.Now().Add(time.Hour).Unix()))) + "." + parts[2]
		for name, tok := range map[string]string{"expired": expired, "wrong secret": wrong, "alg none": none,
			"tampered claims": tampered, "garbage": "not.a.jwt", "huge": strings.Repeat("a", 60_000)} {
			r := reserve(tok, map[string]any{"sku": sku, "quantity": 1})
			if r.Status == http.StatusOK && len(r.Errors) == 0 {
				require.Equal(t, "UNAUTHENTICATED", userErr(t, r, "reserve"), name)
			} else {
				codes := refused(t, r, 200, 400, 401, 431)
				t.Logf("%s: %d %v", name, r.Status, codes)
			}
			// An admin mutation with a forged admin token changes nothing either.
			r = post(ctx, client, p.URL, tok, `mutation { restock(input: {sku: "ABUSE-1", quantity: 1000, eventId: "forged"}) { userErrors { code } } }`, nil)
			cases.Add(1)
			if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 {
				require.Contains(t, string(r.Data), "UNAUTHENTICATED", name)
			}
		}
	})

	t.Run("connection flood", func(t *testing.T) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for range 300 {
			c, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
			require.NoError(t, err)
			conns = append(conns, c)
		}
		var wg sync.WaitGroup
		var served atomic.Int64
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := post(ctx, client, p.URL, "", `query { product(sku: "ABUSE-1") { stock { available } } }`, nil)
				if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 {
					served.Add(1)
				}
				_ = i
			}()
		}
		wg.Wait()
		cases.Add(500)
		require.EqualValues(t, 200, served.Load(), "every request is served while 300 idle connections are open")
	})

	t.Run("slowloris", func(t *testing.T) {
		addr := strings.TrimPrefix(p.URL, "http://")
		// Slow headers: the server hangs up after its ReadHeaderTimeout (10 s).
		slow, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer slow.Close()
		_, err = io.WriteString(slow, "POST /graphql HTTP/1.1\r\nHost: x\r\n")
		require.NoError(t, err)
		cut := make(chan time.Duration, 1)
		start := time.Now()
		go func() {
			for i := 0; ; i++ {
				if _, err := fmt.Fprintf(slow, "X-Slow-%d: y\r\n", i); err != nil {
					cut <- time.Since(start)
					return
				}
				buf := make([]byte, 1)
				_ = slow.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if _, err := slow.Read(buf); err != nil && !isTimeout(err) {
					cut <- time.Since(start)
					return
				}
			}
		}()
		// Slow body: headers complete, body trickles. The rest of the service
		// is not slowed down meanwhile; DROPLINE_BODY_TIMEOUT (10 s) cuts the
		// body off later (TestSlowBodiesAreCutOffAndCappedPerAddress).
		slowBody, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer slowBody.Close()
		_, err = io.WriteString(slowBody, "POST /graphql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
		require.NoError(t, err)
		for i := 0; i < 20; i++ {
			_, _ = io.WriteString(slowBody, " ")
			r := post(ctx, client, p.URL, "", `query { product(sku: "ABUSE-1") { stock { available } } }`, nil)
			require.NoError(t, r.Err)
			require.Equal(t, http.StatusOK, r.Status, "the service answers while slow clients hold connections")
			time.Sleep(100 * time.Millisecond) // the trickle itself
		}
		select {
		case d := <-cut:
			require.Less(t, d, 15*time.Second)
			t.Logf("slow headers cut off after %s", d.Round(100*time.Millisecond))
		case <-time.After(20 * time.Second):
			t.Fatal("a client sending headers slowly was never cut off")
		}
		cases.Add(2)

	})

	// Nothing changed.
	require.Equal(t, before, s.stockOf(sku))
	require.Equal(t, 10, s.scalar(`SELECT total FROM products WHERE sku = $1`, sku))
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM sales`))
	eventually(t, 10*time.Second, "the write-behind drained", func() (bool, string) {
		n := s.scalar(`SELECT count(*)::int FROM reservations WHERE status = 'HELD'`)
		return n == 0, fmt.Sprintf("%d HELD", n)
	})
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM products WHERE sku <> $1`, sku), "no product created")
	t.Logf("FIGURES abuse: requests_and_connections=%d panics=0 state_changes=0 violations=0", cases.Load())
}

func isTimeout(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
