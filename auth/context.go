package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// contextKey is unexported so only this package can set or read the values
// it stores; other packages go through the accessors below.
type contextKey int

const (
	principalKey contextKey = iota + 1
	authErrorKey
)

// WithPrincipal returns a context carrying p. Middleware uses it for HTTP;
// the websocket init hook and tests use it directly.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey, p)
}

// PrincipalFrom returns the verified caller and true, or the zero Principal
// and false for an anonymous request (or one whose token was rejected; see
// AuthErrorFrom).
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey).(Principal)
	if !ok || p.ID == "" {
		return Principal{}, false
	}
	return p, true
}

// WithAuthError returns a context recording why the caller's credentials
// were rejected, so the GraphQL layer can answer UNAUTHENTICATED instead of
// treating the caller as anonymous.
func WithAuthError(ctx context.Context, err error) context.Context {
	return context.WithValue(ctx, authErrorKey, err)
}

// AuthErrorFrom returns the credential failure recorded by Middleware (or
// WithAuthError), or nil when the caller sent no credentials or valid ones.
// The error wraps ErrTokenExpired or ErrTokenInvalid.
func AuthErrorFrom(ctx context.Context) error { //nolint:revive // the name is part of the contract with resolvers/
	err, _ := ctx.Value(authErrorKey).(error)
	return err
}

// Verifier checks a bearer token; *Issuer implements it. Middleware depends
// on this interface so tests can plug in a fixed answer.
type Verifier interface {
	Verify(token string) (Principal, error)
}

// errBadScheme is wrapped into ErrTokenInvalid when the Authorization header
// is present but is not "Bearer <token>".
var errBadScheme = errors.New("authorization header must be \"Bearer <token>\"")

// Middleware reads "Authorization: Bearer <token>" and stores the verified
// Principal in the request context. No header means anonymous. A header
// that fails verification does not stop the request (queries that need no
// identity still work, and GraphQL shapes the error), but it is recorded
// with WithAuthError so mutations answer UNAUTHENTICATED: a bad token is
// never silently treated as anonymous.
func Middleware(v Verifier) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, present, err := FromHeader(v, r.Header.Get("Authorization"))
			if !present {
				next.ServeHTTP(w, r)
				return
			}
			ctx := r.Context()
			if err != nil {
				ctx = WithAuthError(ctx, err)
			} else {
				ctx = WithPrincipal(ctx, p)
			}
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
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
