package server

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// OriginPolicy decides which browser origins may call /graphql. Requests
// without an Origin header (curl, servers, mobile apps) and same-origin
// requests are always allowed; other origins must be listed. Tokens travel
// in the Authorization header, never in cookies, so credentials are never
// allowed cross-origin.
//
// The websocket transport should use Allowed as its origin check too, so
// HTTP and websocket requests obey one policy.
type OriginPolicy struct {
	any     bool
	allowed map[string]bool
}

// NewOriginPolicy builds a policy from an allow list of "scheme://host[:port]"
// origins; "*" allows every origin.
func NewOriginPolicy(origins []string) OriginPolicy {
	p := OriginPolicy{allowed: map[string]bool{}}
	for _, o := range origins {
		o = strings.TrimSuffix(strings.TrimSpace(o), "/")
		if o == "*" {
			p.any = true
			continue
		}
		if o != "" {
			p.allowed[strings.ToLower(o)] = true
		}
	}
	return p
}

// Allowed reports whether r may be served under this policy.
func (p OriginPolicy) Allowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || sameOrigin(origin, r.Host) {
		return true
	}
	return p.any || p.allowed[strings.ToLower(origin)]
}

// sameOrigin compares the Origin's host with the Host the request was sent
// to. The scheme is not compared: behind a TLS-terminating proxy the server
// sees plain HTTP for an https page.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

// preflightMaxAge lets browsers cache a preflight answer for ten minutes.
const preflightMaxAge = 600

// Middleware enforces the policy: a disallowed cross-origin request gets
// 403 before it reaches GraphQL (so a foreign page cannot run even a query
// with the visitor's network position); an allowed one gets the CORS
// headers, and preflights are answered here.
func (p OriginPolicy) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		if !p.Allowed(r) {
			writeJSON(w, r, http.StatusForbidden, errorBody{Error: "origin " + strconv.Quote(origin) + " is not allowed: add it to DROPLINE_CORS_ORIGINS"})
			return
		}
		if sameOrigin(origin, r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Expose-Headers", RequestIDHeader)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			allowHeaders := "Authorization, Content-Type, Accept, " + RequestIDHeader
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				allowHeaders = req
			}
			h.Set("Access-Control-Allow-Headers", allowHeaders)
			h.Set("Access-Control-Max-Age", strconv.Itoa(preflightMaxAge))
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}
