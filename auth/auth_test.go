package auth_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func newIssuer(t *testing.T) *auth.Issuer {
	t.Helper()
	iss, err := auth.NewIssuer(secret)
	require.NoError(t, err)
	return iss
}

func TestMintVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)

	tok, err := iss.Mint("alice@example.com", false, time.Hour)
	require.NoError(t, err)
	p, err := iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "alice@example.com", p.ID)
	require.False(t, p.Admin)
	require.WithinDuration(t, time.Now().Add(time.Hour), p.ExpiresAt, 2*time.Second)

	tok, err = iss.Mint("root", true, time.Minute)
	require.NoError(t, err)
	p, err = iss.Verify(tok)
	require.NoError(t, err)
	require.True(t, p.Admin)
	require.Equal(t, "root", p.ID)
}

func TestNewIssuerRejectsShortSecret(t *testing.T) {
	t.Parallel()
	_, err := auth.NewIssuer([]byte("short"))
	require.ErrorIs(t, err, auth.ErrSecretTooShort)
}

func TestMintValidatesInput(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	for _, id := range []string{"", strings.Repeat("a", 129), "a b", "a:b", "{x}", "é", "a\nb"} {
		_, err := iss.Mint(id, false, time.Hour)
		require.ErrorIs(t, err, auth.ErrInvalidPrincipal, "id %q", id)
	}
	for _, id := range []string{"a", strings.Repeat("a", 128), "A.b_c@d-e9"} {
		require.NoError(t, auth.ValidatePrincipalID(id), "id %q", id)
	}
	_, err := iss.Mint("alice", false, 0)
	require.Error(t, err)
}

// sign builds a token with arbitrary claims and method, to forge the inputs
// Mint refuses to produce.
func sign(t *testing.T, method jwt.SigningMethod, key any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	require.NoError(t, err)
	return s
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	exp := time.Now().Add(time.Hour).Unix()

	noneTok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "mallory", "exp": exp, "role": "admin"})
	// A hand-made "alg":"none" token with an empty signature, as attackers send it.
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	body := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"mallory","role":"admin","exp":9999999999}`))
	rawNone := header + "." + body + "."

	cases := map[string]struct {
		token string
		want  error
	}{
		"alg none":          {noneTok, auth.ErrTokenInvalid},
		"alg none by hand":  {rawNone, auth.ErrTokenInvalid},
		"wrong secret":      {sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-xx"), jwt.MapClaims{"sub": "a", "exp": exp}), auth.ErrTokenInvalid},
		"HS512 not allowed": {sign(t, jwt.SigningMethodHS512, secret, jwt.MapClaims{"sub": "a", "exp": exp}), auth.ErrTokenInvalid},
		"missing exp":       {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a"}), auth.ErrTokenInvalid},
		"expired":           {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": time.Now().Add(-time.Minute).Unix()}), auth.ErrTokenExpired},
		"missing sub":       {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp}), auth.ErrTokenInvalid},
		"bad sub":           {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a b", "exp": exp}), auth.ErrTokenInvalid},
		"unknown role":      {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": exp, "role": "owner"}), auth.ErrTokenInvalid},
		"not yet valid":     {sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": exp, "nbf": exp - 60}), auth.ErrTokenInvalid},
		"garbage":           {"not.a.token", auth.ErrTokenInvalid},
		"empty":             {"", auth.ErrTokenInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, err := iss.Verify(tc.token)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, auth.Principal{}, p)
			if tc.token != "" {
				require.NotContains(t, err.Error(), tc.token, "errors must not echo the token")
			}
		})
	}
}

func TestExpiryWithClock(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	iss := newIssuer(t).WithClock(func() time.Time { return now })
	tok, err := iss.Mint("bob", false, time.Minute)
	require.NoError(t, err)

	_, err = iss.WithClock(func() time.Time { return now.Add(59 * time.Second) }).Verify(tok)
	require.NoError(t, err)
	_, err = iss.WithClock(func() time.Time { return now.Add(2 * time.Minute) }).Verify(tok)
	require.ErrorIs(t, err, auth.ErrTokenExpired)
}

func TestContextHelpers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, ok := auth.PrincipalFrom(ctx)
	require.False(t, ok)

	ctx = auth.WithPrincipal(ctx, auth.Principal{ID: "carol", Admin: true})
	p, ok := auth.PrincipalFrom(ctx)
	require.True(t, ok)
	require.Equal(t, "carol", p.ID)

	// A string key of the same name cannot collide with the private key type.
	ctx = context.WithValue(ctx, "principal", "mallory") //nolint:staticcheck,revive // deliberately a string key
	p, _ = auth.PrincipalFrom(ctx)
	require.Equal(t, "carol", p.ID)
}

// A principal is one allocation on its context, which keeps the rest of
// a context: the values under it, a later principal over it, its end.
func TestPrincipalContext(t *testing.T) {
	type other struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), other{}, "kept"))
	ctx := auth.WithPrincipal(parent, auth.Principal{ID: "carol"})
	require.Equal(t, "kept", ctx.Value(other{}))
	p, ok := auth.PrincipalFrom(auth.WithPrincipal(ctx, auth.Principal{ID: "dave", Admin: true}))
	require.True(t, ok)
	require.Equal(t, auth.Principal{ID: "dave", Admin: true}, p)
	_, ok = auth.PrincipalFrom(auth.WithPrincipal(ctx, auth.Principal{}))
	require.False(t, ok, "a principal without an id is anonymous")
	child, stop := context.WithCancel(ctx)
	defer stop()
	cancel()
	<-child.Done()
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	bg := context.Background()
	require.Equal(t, 1.0, testing.AllocsPerRun(100, func() { sink = auth.WithPrincipal(bg, p) }))
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	good, err := iss.Mint("dave", false, time.Hour)
	require.NoError(t, err)

	type seen struct {
		p         auth.Principal
		ok        bool
		served    bool
		status    int
		challenge string
		err       error
	}
	var got seen
	refuse := func(w http.ResponseWriter, _ *http.Request, err error) {
		got.err = err
		w.WriteHeader(http.StatusUnauthorized)
	}
	h := auth.Middleware(iss, refuse)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.served = true
		got.p, got.ok = auth.PrincipalFrom(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	do := func(header string) seen {
		got = seen{}
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		got.status = resp.StatusCode
		got.challenge = resp.Header.Get("WWW-Authenticate")
		return got
	}

	s := do("")
	require.True(t, s.served)
	require.False(t, s.ok, "no header is anonymous, not an error")
	require.Equal(t, http.StatusNoContent, s.status)
	require.Empty(t, s.challenge)

	s = do("Bearer " + good)
	require.True(t, s.ok)
	require.Equal(t, "dave", s.p.ID)
	require.Equal(t, http.StatusNoContent, s.status)

	s = do("bearer " + good)
	require.True(t, s.ok, "the scheme is case-insensitive")

	for _, bad := range []string{"Bearer " + good + "x", "Basic ZGF2ZTpwdw==", "Bearer", "Bearer    ", "Token " + good} {
		s = do(bad)
		require.False(t, s.served, "a bad token is refused before anything runs: %s", bad)
		require.Equal(t, http.StatusUnauthorized, s.status, bad)
		require.Equal(t, `Bearer error="invalid_token", error_description="the bearer token is not valid"`, s.challenge, bad)
		require.ErrorIs(t, s.err, auth.ErrTokenInvalid, bad)
		require.NotContains(t, s.err.Error(), "\n")
	}

	expired, err := iss.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }).Mint("dave", false, time.Hour)
	require.NoError(t, err)
	s = do("Bearer " + expired)
	require.False(t, s.served)
	require.ErrorIs(t, s.err, auth.ErrTokenExpired)
	require.Equal(t, `Bearer error="invalid_token", error_description="the bearer token has expired"`, s.challenge)
}

func TestIssuerAndAudienceChecks(t *testing.T) {
	t.Parallel()
	iss, err := auth.NewIssuerWith(auth.IssuerConfig{Secret: secret, Issuer: "https://login.shop.example", Audience: "dropline-eu"})
	require.NoError(t, err)
	exp := time.Now().Add(time.Hour).Unix()

	// What Mint writes is accepted, and carries both claims.
	tok, err := iss.Mint("alice", false, time.Hour)
	require.NoError(t, err)
	p, err := iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "alice", p.ID)
	var c jwt.RegisteredClaims
	_, _, err = jwt.NewParser().ParseUnverified(tok, &c)
	require.NoError(t, err)
	require.Equal(t, "https://login.shop.example", c.Issuer)
	require.Equal(t, jwt.ClaimStrings{"dropline-eu"}, c.Audience)

	good := jwt.MapClaims{"sub": "a", "exp": exp, "iss": "https://login.shop.example", "aud": []string{"other", "dropline-eu"}}
	_, err = iss.Verify(sign(t, jwt.SigningMethodHS256, secret, good))
	require.NoError(t, err, "one of several audiences is enough")
	for name, claims := range map[string]jwt.MapClaims{
		"no iss":    {"sub": "a", "exp": exp, "aud": "dropline-eu"},
		"wrong iss": {"sub": "a", "exp": exp, "iss": "dropline", "aud": "dropline-eu"},
		"no aud":    {"sub": "a", "exp": exp, "iss": "https://login.shop.example"},
		"wrong aud": {"sub": "a", "exp": exp, "iss": "https://login.shop.example", "aud": "dropline-us"},
	} {
		_, err := iss.Verify(sign(t, jwt.SigningMethodHS256, secret, claims))
		require.ErrorIs(t, err, auth.ErrTokenInvalid, name)
	}

	// Without configuration, neither claim is checked (the default).
	_, err = newIssuer(t).Verify(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": exp, "iss": "anyone"}))
	require.NoError(t, err)
}

func TestMaxLifetime(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	iss, err := auth.NewIssuerWith(auth.IssuerConfig{Secret: secret, MaxLifetime: time.Hour})
	require.NoError(t, err)
	iss = iss.WithClock(func() time.Time { return now })
	require.Equal(t, time.Hour, iss.MaxLifetime())

	tok, err := iss.Mint("bob", false, time.Hour)
	require.NoError(t, err)
	_, err = iss.Verify(tok)
	require.NoError(t, err, "exactly the maximum is fine")
	_, err = iss.Mint("bob", false, time.Hour+time.Second)
	require.ErrorContains(t, err, "maximum token lifetime")

	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	for name, claims := range map[string]jwt.MapClaims{
		"exp - iat too long":           {"sub": "a", "iat": at(-time.Hour), "exp": at(time.Minute)},
		"exp too far without iat":      {"sub": "a", "exp": at(2 * time.Hour)},
		"exp too far, iat in future":   {"sub": "a", "iat": at(time.Hour), "exp": at(90 * time.Minute)},
		"a year, as a leaked token is": {"sub": "a", "iat": at(0), "exp": at(365 * 24 * time.Hour)},
	} {
		_, err := iss.Verify(sign(t, jwt.SigningMethodHS256, secret, claims))
		require.ErrorIs(t, err, auth.ErrTokenInvalid, name)
		require.ErrorContains(t, err, "maximum token lifetime", name)
	}
	_, err = iss.Verify(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "iat": at(-30 * time.Minute), "exp": at(30 * time.Minute)}))
	require.NoError(t, err)

	_, err = auth.NewIssuerWith(auth.IssuerConfig{Secret: secret, MaxLifetime: -time.Second})
	require.Error(t, err)
}

// A token verified once is remembered (busy buyers send the same token with
// every request), but never past its expiry, and a token differing from a
// remembered one in any byte is checked afresh.
func TestVerifiedTokensAreRememberedOnlyUntilExpiry(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	iss := newIssuer(t).WithClock(clock)
	tok, err := iss.Mint("carol", true, time.Minute)
	require.NoError(t, err)

	for range 3 {
		p, err := iss.Verify(tok)
		require.NoError(t, err)
		require.Equal(t, "carol", p.ID)
		require.True(t, p.Admin)
	}

	// Same header and claims, another signature: refused, though the genuine
	// token is remembered.
	parts := strings.Split(tok, ".")
	forged := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString([]byte("not the signature, 32 bytes long!"))
	_, err = iss.Verify(forged)
	require.ErrorIs(t, err, auth.ErrTokenInvalid)
	// A remembered token with a byte appended is another token.
	_, err = iss.Verify(tok + "A")
	require.ErrorIs(t, err, auth.ErrTokenInvalid)

	// Within the leeway after expiry it is still good, as when parsed.
	advance(time.Minute + 4*time.Second)
	_, err = iss.Verify(tok)
	require.NoError(t, err)
	advance(2 * time.Second)
	_, err = iss.Verify(tok)
	require.ErrorIs(t, err, auth.ErrTokenExpired, "a remembered token expires like any other")
}

// Many distinct tokens: the memory of verified tokens stays bounded, and
// every token keeps verifying (concurrently, under -race).
func TestVerifyManyTokensConcurrently(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	const n = 40000 // more than the cache holds
	toks := make([]string, n)
	for i := range toks {
		var err error
		toks[i], err = iss.Mint(fmt.Sprintf("buyer-%d", i), false, time.Hour)
		require.NoError(t, err)
	}
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				p, err := iss.Verify(toks[i])
				if err == nil && p.ID != fmt.Sprintf("buyer-%d", i) {
					err = fmt.Errorf("token %d verified as %s", i, p.ID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// signRaw signs header and payload exactly as written, so a test can send
// JSON no encoder would write (a key twice).
func signRaw(header, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	unsigned := enc([]byte(header)) + "." + enc([]byte(payload))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc(mac.Sum(nil))
}

// A token that names a key twice is refused, whichever value comes last
// and at any depth, although its signature is good: readers disagree on
// which value counts. The same token without the repeat is accepted.
func TestDuplicatedClaimsAreRefused(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	const hs256 = `{"alg":"HS256","typ":"JWT"}`
	p, err := iss.Verify(signRaw(hs256, `{"sub":"eve","role":"admin","exp":`+exp+`}`))
	require.NoError(t, err)
	require.True(t, p.Admin, "the single-claim form is good")

	for name, tok := range map[string]string{
		"role twice, admin last":  signRaw(hs256, `{"sub":"eve","role":"buyer","role":"admin","exp":`+exp+`}`),
		"role twice, admin first": signRaw(hs256, `{"sub":"eve","role":"admin","role":"","exp":`+exp+`}`),
		"sub twice":               signRaw(hs256, `{"sub":"eve","sub":"alice","exp":`+exp+`}`),
		"exp twice":               signRaw(hs256, `{"sub":"eve","exp":`+exp+`,"exp":99999999999}`),
		"nested key twice":        signRaw(hs256, `{"sub":"eve","exp":`+exp+`,"ctx":[{"a":1,"a":2}]}`),
		"header alg twice":        signRaw(`{"alg":"none","alg":"HS256","typ":"JWT"}`, `{"sub":"eve","exp":`+exp+`}`),
	} {
		_, err := iss.Verify(tok)
		require.ErrorIs(t, err, auth.ErrTokenInvalid, name)
		require.ErrorIs(t, err, auth.ErrDuplicateClaim, name)
	}
	// Keys repeated in different objects are not duplicates.
	_, err = iss.Verify(signRaw(hs256, `{"sub":"eve","exp":`+exp+`,"ctx":[{"a":1},{"a":2}],"more":{"sub":"x"}}`))
	require.NoError(t, err)
}

// sink keeps what an allocation count makes on the heap, as a request does.
var sink context.Context
