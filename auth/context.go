package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/dropline/dropline/internal/header"
)

// contextKey is unexported so only this package can set or read the values
// it stores; other packages go through the accessors below.
type contextKey int

const principalKey contextKey = 1

// WithPrincipal returns a context carrying p. Middleware uses it for HTTP;
// the websocket init hook and tests use it directly.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return &principalContext{Context: ctx, p: p}
}

// principalContext is what context.WithValue would make of a Principal:
// the Principal and its context in one allocation instead of two (the
// Principal's interface value is the other).
type principalContext struct {
	context.Context
	p Principal
}

func (c *principalContext) Value(key any) any {
	if key == principalKey {
		return c
	}
	return c.Context.Value(key)
}

// PrincipalFrom returns the verified caller and true, or the zero Principal
// and false for an anonymous request.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	c, _ := ctx.Value(principalKey).(*principalContext)
	if c == nil || c.p.ID == "" {
		return Principal{}, false
	}
	return c.p, true
}

// Verifier checks a bearer token; *Issuer implements it. Middleware depends
// on this interface so tests can plug in a fixed answer.
type Verifier interface {
	Verify(token string) (Principal, error)
}

// errBadScheme is wrapped into ErrTokenInvalid when the Authorization header
// is present but is not "Bearer <token>".
var errBadScheme = errors.New("authorization header must be \"Bearer <token>\"")

// Refusal answers a request whose credentials did not verify. Middleware
// has set WWW-Authenticate already; the Refusal writes status 401 and a
// body in its caller's shape. err wraps ErrTokenExpired or ErrTokenInvalid.
type Refusal func(w http.ResponseWriter, r *http.Request, err error)

// Middleware reads "Authorization: Bearer <token>" and stores the verified
// Principal in the request context. No header means anonymous. A header
// that does not verify is refused with 401 and "WWW-Authenticate: Bearer"
// (RFC 6750) before anything runs, whatever the request asks for: a client
// that sent credentials meant to be someone, and answering it as anonymous
// would hide a broken sign-in (and serve a public read to a caller who
// believes it acted as itself).
func Middleware(v Verifier, refuse Refusal) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, present, err := FromHeader(v, header.Get(r.Header, "Authorization"))
			switch {
			case !present:
				next.ServeHTTP(w, r)
			case err != nil:
				w.Header().Set("WWW-Authenticate", Challenge(err))
				refuse(w, r, err)
			default:
				next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
			}
		})
	}
}

// Challenge is the WWW-Authenticate value that answers a token refused
// with err: RFC 6750's invalid_token, with a description that says
// whether signing in again helps.
func Challenge(err error) string {
	return `Bearer error="invalid_token", error_description="` + Problem(err) + `"`
}

// Problem says in a few words why err refused a token, for clients: never
// the token, never the parser's internals.
func Problem(err error) string {
	if errors.Is(err, ErrTokenExpired) {
		return "the bearer token has expired"
	}
	return "the bearer token is not valid"
}

// FromHeader interprets an Authorization header value (or the same string
// sent in a websocket connection_init payload). present is false when the
// value is empty, meaning an anonymous caller.
func FromHeader(v Verifier, header string) (p Principal, present bool, err error) {
	header = strings.TrimSpace(header)
	if header == "" {
		return Principal{}, false, nil
	}
	scheme, token, _ := strings.Cut(header, " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return Principal{}, true, fmt.Errorf("%w: %w", ErrTokenInvalid, errBadScheme)
	}
	p, err = v.Verify(token)
	if err != nil {
		return Principal{}, true, err
	}
	return p, true, nil
}
