package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dropline/dropline/internal/tracing"
)

// Route names used as the "route" metric label. Fixed names keep the label
// cardinality bounded whatever paths clients request.
const (
	routeGraphQL    = "graphql"
	routePlayground = "playground"
	routeShop       = "shop"
	routeDevToken   = "dev_token"
	routeHealthz    = "healthz"
	routeReadyz     = "readyz"
	routeMetrics    = "metrics"
	routeOther      = "other"
)

func routeOf(path string) string {
	switch path {
	case "/graphql":
		return routeGraphQL
	case "/", "/index.html":
		return routePlayground
	case "/healthz":
		return routeHealthz
	case "/readyz":
		return routeReadyz
	case "/metrics":
		return routeMetrics
	case DevTokenPath:
		return routeDevToken
	}
	if path == "/shop" || strings.HasPrefix(path, "/shop/") {
		return routeShop
	}
	if strings.HasPrefix(path, "/assets/") {
		return routePlayground
	}
	return routeOther
}

// routes builds the mux and wraps it in the middleware chain, outermost
// first: request id (so every later line has it), the client address
// (which the access log, the caps per address and the stream caps use),
// access log and metrics (so they see the final status, including
// recovered panics and refusals), recovery, in dev mode the refusal of a
// Host that is not loopback, the cap on requests in flight per address,
// the deadline of the body.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()

	gql := s.cfg.GraphQL
	if gql == nil {
		gql = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, r, http.StatusServiceUnavailable, errorBody{Error: "graphql handler not configured"})
		})
	}
	// The GraphQL handler owns what is specific to it: CORS and the
	// websocket origin check (one allow-list), body limits, auth.
	mux.Handle("/graphql", gql)

	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /readyz", readyHandler(s.cfg.Checks, s.cfg.CheckTimeout, false))
	if !s.cfg.NoMetrics {
		mux.Handle("GET /metrics", metricsHandler(s.cfg.Registry, s.log))
	}
	// The shop lives under /shop/; the mux redirects "/shop" there, so its
	// relative asset URLs resolve under /shop/assets/.
	if s.cfg.Shop != nil {
		mux.Handle("/shop/", s.cfg.Shop)
	}
	// Only in dev mode: elsewhere the path falls to the catch-all's 404.
	if s.cfg.DevToken != nil {
		mux.Handle(DevTokenPath, devTokenHandler(s.cfg.DevToken))
	}
	// The playground is the catch-all: it serves "/" and its assets and
	// answers 404 for anything else it does not know.
	if s.cfg.Playground != nil {
		mux.Handle("/", s.cfg.Playground)
	} else {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, r, http.StatusNotFound, errorBody{Error: "not found"})
		})
	}

	m := newHTTPMetrics(s.cfg.Registry)
	var h http.Handler = mux
	h = bodyDeadline(s.cfg.BodyTimeout, h)
	h = newInFlight(s.cfg.RequestsPerAddr).middleware(h)
	if s.cfg.LoopbackHostOnly {
		h = loopbackHostOnly(h)
	}
	h = recoverer(h)
	h = accessLog(m, h)
	// RequestID, then the client address resolver's middleware.
	h = requestScope(s.log, s.cfg.ClientAddr, h)
	if s.cfg.Tracer != nil {
		h = continueTrace(h)
	}
	return h
}

// metricsHandler serves reg in Prometheus' text format.
func metricsHandler(reg prometheus.Gatherer, log zerolog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: promLogger{log},
		// Serve what could be gathered rather than nothing when one
		// collector fails.
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// continueTrace puts the remote span a request's traceparent names in its
// context, so the spans made while serving it (the GraphQL operation's and
// what it causes) join the caller's trace. A request without one, or with a
// malformed one, starts a new trace there.
func continueTrace(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("traceparent") != "" {
			r = r.WithContext(tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		next.ServeHTTP(w, r)
	})
}

// errorBody is the JSON shape of errors this package writes itself.
type errorBody struct {
	Error     string `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	if e, ok := v.(errorBody); ok && e.RequestID == "" {
		e.RequestID = RequestIDFrom(r.Context())
		v = e
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// promLogger adapts zerolog to promhttp's Logger interface.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Error().Str("component", "metrics").Msg(fmt.Sprint(v...))
}
