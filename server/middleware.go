package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/requestid"
)

// RequestIDHeader carries the request id in both directions: a sane
// incoming value (from a load balancer or client) is kept so one id follows
// the request across systems; otherwise one is generated.
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds accepted incoming ids; they are logged verbatim.
const maxRequestIDLen = 128

// RequestIDFrom returns the id of the request ctx belongs to, or "" outside
// a request. The GraphQL error presenter puts it into error extensions so a
// user report can be matched to log lines.
func RequestIDFrom(ctx context.Context) string {
	return requestid.From(ctx)
}

// WithRequestID returns a context carrying id, for code (tests, workers)
// that wants request-style log correlation outside the HTTP path.
func WithRequestID(ctx context.Context, id string) context.Context {
	return requestid.With(ctx, id)
}

// saneRequestID accepts only ids that cannot forge log lines or headers.
func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// RequestID assigns the request id, echoes it in the response header and
// stores it, with a logger carrying it, in the context: handlers log with
// zerolog.Ctx(r.Context()) and every line has request_id. The Server
// applies it to every route; it is exported so a handler tested without
// the Server (the GraphQL handler's tests) gets the same request context.
func RequestID(base zerolog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(requestContext(r.Context(), base, w, r)))
	})
}

// requestContext chooses r's id, echoes it, and returns ctx (r's) with
// the id and a logger carrying it, for RequestID and requestScope.
func requestContext(ctx context.Context, base zerolog.Logger, w http.ResponseWriter, r *http.Request) context.Context {
	id := header.Get(r.Header, RequestIDHeader)
	if !saneRequestID(id) {
		id = requestid.New()
	}
	w.Header().Set(RequestIDHeader, id)
	l := base.With().Str("request_id", id).Logger()
	return l.WithContext(WithRequestID(ctx, id))
}

// requestScope is RequestID around ca's middleware (the resolved client
// address in the context) in one copy of the request instead of two: each
// copy of an http.Request is an allocation of its whole size.
func requestScope(base zerolog.Logger, ca clientaddr.Resolver, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := requestContext(r.Context(), base, w, r)
		if a := ca.Addr(r); a.IsValid() {
			ctx = clientaddr.With(ctx, a)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// httpMetrics are the RED metrics of the HTTP surface.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
}

func newHTTPMetrics(reg *prometheus.Registry) httpMetrics {
	m := httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_http_requests_total",
			Help: "HTTP requests served, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dropline_http_request_duration_seconds",
			Help:    "HTTP request latency by route (websocket sessions excluded).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_http_requests_in_flight",
			Help: "HTTP requests (and websocket sessions) being served now.",
		}),
	}
	m.requests = prom.Register(reg, m.requests)
	m.duration = prom.Register(reg, m.duration)
	m.inFlight = prom.Register(reg, m.inFlight)
	return m
}

// normalizedMethod keeps the method label bounded.
func normalizedMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodOptions, http.MethodHead:
		return m
	}
	return "other"
}

// statusLabel is strconv.Itoa without an allocation for the usual codes.
func statusLabel(code int) string {
	switch code {
	case http.StatusOK:
		return "200"
	case http.StatusNoContent:
		return "204"
	case http.StatusBadRequest:
		return "400"
	}
	return strconv.Itoa(code)
}

// accessLog writes one line per request and records metrics. It logs the
// path but never the query string or headers: GET queries and the
// Authorization header may carry tokens and personal data.
func accessLog(m httpMetrics, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, start: time.Now()}
		m.inFlight.Inc()
		// recoverer sits inside, so next returns normally even when a
		// handler panics (only http.ErrAbortHandler passes, by design).
		next.ServeHTTP(sw, r)
		m.inFlight.Dec()
		logRequest(m, r, sw, time.Since(sw.start))
	})
}

func logRequest(m httpMetrics, r *http.Request, sw *statusWriter, elapsed time.Duration) {
	status := sw.statusCode()
	route := routeOf(r.URL.Path)
	m.requests.WithLabelValues(route, normalizedMethod(r.Method), statusLabel(status)).Inc()
	if !sw.hijacked {
		m.duration.WithLabelValues(route).Observe(elapsed.Seconds())
	}

	l := zerolog.Ctx(r.Context())
	var ev *zerolog.Event
	switch {
	case route == routeHealthz || route == routeReadyz || route == routeMetrics:
		// Probes poll every few seconds: keep them out of info logs unless
		// they fail, and a 503 from /readyz is a state of a dependency, not
		// a server error.
		if status >= 400 {
			ev = l.Warn()
		} else {
			ev = l.Debug()
		}
	case status >= 500:
		ev = l.Error()
	default:
		ev = l.Info()
	}
	ev.Str("method", r.Method).
		Str("path", r.URL.Path).
		Int("status", status).
		Int64("bytes", sw.bytes).
		Dur("duration", elapsed).
		Str("remote", r.RemoteAddr).
		Str("client", clientaddr.Of(r)).
		Msg("request")
}

// recoverer turns a handler panic into a logged stack and a 500 JSON body
// carrying the request id, instead of a dropped connection.
func recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { //nolint:contextcheck // the deferred handler uses r's own context
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler { //nolint:errorlint // sentinel compared as net/http does
				panic(v) // net/http's own signal to abort silently
			}
			zerolog.Ctx(r.Context()).Error().
				Str("panic", fmt.Sprint(v)).
				Bytes("stack", debug.Stack()).
				Msg("handler panic")
			if sw, ok := w.(*statusWriter); ok && (sw.wroteHeader || sw.hijacked) {
				return // too late for a clean response; the client sees a truncated body
			}
			writeJSON(w, r, http.StatusInternalServerError, errorBody{Error: "internal error"})
		}()
		next.ServeHTTP(w, r)
	})
}

// statusWriter records the status and size of a response. It keeps
// Flush (server-sent events) and Hijack (websockets) working, and Unwrap
// lets http.ResponseController reach the original writer.
type statusWriter struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	hijacked    bool
	// start is when the access log began the request, which bodyDeadline
	// counts the body's time from too (one clock read for both), and body
	// is where bodyDeadline keeps the request's body (one allocation for
	// both).
	start time.Time
	body  deadlineBody
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		// 1xx responses are informational; the final status comes later.
		if code >= 200 || code == http.StatusSwitchingProtocols {
			w.status = code
			w.wroteHeader = true
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.status = http.StatusOK
		w.wroteHeader = true
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) statusCode() int {
	switch {
	case w.status != 0:
		return w.status // an SSE stream is taken over after its 200
	case w.hijacked:
		return http.StatusSwitchingProtocols
	}
	return http.StatusOK
}

// Flush forwards to the underlying writer when it can flush.
func (w *statusWriter) Flush() {
	if !w.wroteHeader {
		w.status = http.StatusOK
		w.wroteHeader = true
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection to a websocket library.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// Unwrap exposes the original writer to http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bodyDeadline bounds the time to read a request's body (BodyTimeout) with
// a read deadline on the connection, set when the handler starts and
// lifted when the body has been read to its end: a deadline left in place
// would cut the connection's later reads, which net/http uses to notice a
// client that went away, and so end long answers and streams. A request
// without a body (websocket upgrades, GETs) is left alone. A handler that
// reads a body past its deadline gets an error wrapping
// os.ErrDeadlineExceeded, and net/http closes the connection after the
// answer.
func bodyDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		// Behind the access log, the body and the time it counts from are
		// its writer's.
		var b *deadlineBody
		var start time.Time
		if sw, ok := w.(*statusWriter); ok {
			b, start = &sw.body, sw.start
		} else {
			b, start = &deadlineBody{}, time.Now()
		}
		*b = deadlineBody{ReadCloser: r.Body, w: w}
		if setReadDeadline(w, start.Add(d)) != nil {
			next.ServeHTTP(w, r) // not a connection of net/http's (a test's recorder)
			return
		}
		r.Body = b
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline when the body ends; w is the
// response's writer, whose http.ResponseController sets it.
type deadlineBody struct {
	io.ReadCloser
	w    http.ResponseWriter
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		_ = setReadDeadline(b.w, time.Time{})
	}
	return n, err
}

// setReadDeadline sets the read deadline of w's connection, with the
// http.ResponseController on the stack (written inline in a handler, the
// controller went to the heap).
func setReadDeadline(w http.ResponseWriter, t time.Time) error {
	return http.NewResponseController(w).SetReadDeadline(t)
}

// loopbackHostOnly refuses a request whose Host is not a loopback name
// (Config.LoopbackHostOnly), before anything else runs.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeJSON(w, r, http.StatusForbidden, errorBody{Error: "dev mode answers only requests for localhost, 127.0.0.1 or [::1]"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether host ("name", "name:port", "[::1]:port")
// names this machine's loopback: localhost, or a loopback address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Zone() == "" && a.Unmap().IsLoopback()
}
