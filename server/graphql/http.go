package graphql

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/resolvers"
	"github.com/dropline/dropline/server"
)

// limitBody reads at most n bytes of the body before GraphQL sees it, so an
// oversized request gets 413 whether or not it declared its length, and
// gqlgen never buffers more than n; a body that does not arrive within the
// server's BodyTimeout gets 408.
func limitBody(n int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > n {
			writeError(w, r, http.StatusRequestEntityTooLarge, "request body too large")
			return
		}
		// A body of a declared length net/http reads no further than it,
		// so one within n needs no other bound.
		b := r.Body
		if r.ContentLength < 0 {
			b = http.MaxBytesReader(w, b, n)
		}
		body, err := readAll(b, r.ContentLength)
		switch {
		case err == nil:
		case tooLarge(err):
			writeError(w, r, http.StatusRequestEntityTooLarge, "request body too large")
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The server's bound on the time to send a body (BodyTimeout).
			writeError(w, r, http.StatusRequestTimeout, "the request body did not arrive in time")
			return
		default:
			writeError(w, r, http.StatusBadRequest, "could not read request body")
			return
		}
		rb := &readBody{b: body}
		rb.Reset(body)
		r.Body = rb
		next.ServeHTTP(w, r)
	})
}

// tooLarge reports whether err is http.MaxBytesReader's refusal of a body
// over its limit (out of line, so that a request whose body is read has no
// place for errors.As to allocate).
func tooLarge(err error) bool {
	var e *http.MaxBytesError
	return errors.As(err, &e)
}

// readAll is io.ReadAll with room from the start for a body of its
// declared length (up to 64 KiB: a declared length is not yet a body) and
// the read that finds its end, which is all a body as long as it declared
// needs; a body of unknown length starts as io.ReadAll does.
func readAll(r io.Reader, length int64) ([]byte, error) {
	size := 512
	if length >= 0 {
		size = int(min(length, 64<<10)) + 1
	}
	b := make([]byte, 0, size)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF { //nolint:errorlint // io.Reader's own sentinel, returned as is
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // room to read more
		}
	}
}

// readBody is a body limitBody has read whole; bodyBytes hands out its
// bytes instead of a copy.
type readBody struct {
	bytes.Reader
	b []byte
}

// Close does nothing: the connection's body was read to its end.
func (*readBody) Close() error { return nil }

// bodyBytes reads what is left of r's body.
func bodyBytes(r *http.Request) ([]byte, error) {
	if rb, ok := r.Body.(*readBody); ok {
		rest := rb.b[len(rb.b)-rb.Len():]
		_, _ = rb.Seek(0, io.SeekEnd)
		return rest, nil
	}
	return io.ReadAll(r.Body)
}

// writeError answers in the GraphQL response shape, so clients parse HTTP
// refusals like any other error.
func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]any{{
		"message":    msg,
		"extensions": map[string]any{"code": httpCode(status), "requestId": server.RequestIDFrom(r.Context())},
	}}})
}

// refuseToken answers a request whose bearer token did not verify (the
// auth.Refusal of NewHandler): 401 UNAUTHENTICATED in the GraphQL response
// shape, on every transport, before a websocket is upgraded or an SSE
// stream opened.
func refuseToken(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, r, http.StatusUnauthorized, auth.Problem(err)+": send a valid token, or none to be anonymous")
}

func httpCode(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return "PAYLOAD_TOO_LARGE"
	case http.StatusForbidden:
		return "ORIGIN_NOT_ALLOWED"
	case http.StatusTooManyRequests:
		return resolvers.CodeRateLimited
	case http.StatusUnauthorized:
		return resolvers.CodeUnauthenticated
	case http.StatusRequestTimeout:
		return "REQUEST_TIMEOUT"
	}
	return "BAD_REQUEST"
}

// preflightMaxAge lets browsers cache a preflight answer for ten minutes.
const preflightMaxAge = 600

// corsAllowHeaders are the request headers a cross-origin browser client may
// send. A preflight that asks for any header not listed fails in the browser,
// so the list covers what the GraphQL clients Dropline serves really send:
// the token and content type; Apollo Client's clientAwareness
// (apollographql-client-name/-version), its CSRF-prevention header
// (apollo-require-preflight) and operation name header; graphql-sse's stream
// token; our request id; and W3C / Sentry trace propagation, which
// instrumented frontends add to every fetch. Credentials stay disallowed.
var corsAllowHeaders = strings.Join([]string{
	"Authorization", "Content-Type", "Accept", server.RequestIDHeader,
	"apollographql-client-name", "apollographql-client-version",
	"apollo-require-preflight", "x-apollo-operation-name",
	"x-graphql-event-stream-token",
	"traceparent", "tracestate", "baggage", "sentry-trace",
}, ", ")

// corsExposeHeaders are the response headers a cross-origin browser client
// may read: our request id, and the cost budget's RateLimit fields and
// Retry-After, so a client can pace itself.
var corsExposeHeaders = strings.Join([]string{
	server.RequestIDHeader, "RateLimit", "RateLimit-Policy", "Retry-After",
}, ", ")

// cors is the allow-list of browser origins. Tokens travel in the
// Authorization header, never cookies, so credentials are never allowed.
// The same list should drive the websocket origin check.
type cors struct {
	any     bool
	allowed map[string]bool
}

func newCORS(origins []string) cors {
	c := cors{allowed: map[string]bool{}}
	for _, o := range origins {
		o = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(o), "/"))
		switch o {
		case "":
		case "*":
			c.any = true
		default:
			c.allowed[o] = true
		}
	}
	return c
}

// Allowed reports whether a request from origin to host may be served.
func (c cors) Allowed(origin, host string) bool {
	return origin == "" || sameOrigin(origin, host) || c.any || c.allowed[strings.ToLower(origin)]
}

// sameOrigin compares the Origin's host with the request's Host; the
// scheme is not compared because a TLS-terminating proxy hides it.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

// middleware refuses listed-out origins with 403 before anything runs,
// answers preflights, and sets the CORS headers on allowed requests.
func (c cors) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := header.Get(r.Header, "Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		if !c.Allowed(origin, r.Host) {
			writeError(w, r, http.StatusForbidden, "origin "+strconv.Quote(origin)+" is not allowed")
			return
		}
		if sameOrigin(origin, r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		if r.Method == http.MethodOptions && header.Get(r.Header, "Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", strconv.Itoa(preflightMaxAge))
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}
