// Package server is Dropline's HTTP surface: it mounts the GraphQL,
// playground and shop handlers it is given next to /healthz, /readyz and
// /metrics (and, in dev mode, /dev/token for the shop's sign-in),
// wraps everything in request ids, access logs, metrics and panic recovery,
// and owns the listener so the App can bind port 0 and shut down gracefully.
//
// It knows nothing about GraphQL, Redis or Postgres: those arrive as
// http.Handlers and readiness Checks, which keeps this package testable with
// httptest alone.
package server

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/startstop"
)

// Defaults for the zero values of Config.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultCheckTimeout      = time.Second
	DefaultBodyTimeout       = 10 * time.Second
	DefaultRequestsPerAddr   = 1024
)

// Config is what New needs. Handlers and checks are injected so the server
// can be tested without Redis or Postgres.
type Config struct {
	// Addr is the listen address, e.g. ":8080"; port 0 picks a free port
	// (see Server.Addr). Default: ":8080".
	Addr string

	// GraphQL serves /graphql (POST, GET and websocket upgrades), mounted
	// as it is: it enforces its own origins and body limit. Nil answers 503.
	GraphQL http.Handler

	// Playground serves "/" and is the catch-all for paths not listed
	// above (its assets live under /assets/); it answers 404 itself for
	// paths it does not know. Nil answers every such path with a JSON 404.
	Playground http.Handler

	// Shop serves the demo storefront under /shop/ (with the prefix
	// still on the path; shop.Handler strips it). "/shop" redirects to
	// "/shop/". Nil leaves /shop to the catch-all (404).
	Shop http.Handler

	// DevToken, when set, serves POST /dev/token {"user": NAME} with a buyer
	// token for NAME, for the shop's dev sign-in. Set it in dev mode only;
	// nil (the default) leaves the path to the catch-all, which answers 404.
	DevToken DevTokenFunc

	// Checks run on every /readyz request, concurrently, each under
	// CheckTimeout. Empty means always ready.
	Checks []Check

	// Registry receives the HTTP metrics and is exposed on /metrics. Nil
	// creates a private registry; Dropline never uses the global one.
	Registry *prometheus.Registry

	// Logger writes access logs and panics; each request gets a child with
	// its request_id in the context (zerolog.Ctx). Default: a disabled logger.
	Logger zerolog.Logger

	// ReadHeaderTimeout bounds how long a client may take to send headers
	// (slowloris protection). Default: 10s.
	ReadHeaderTimeout time.Duration

	// LoopbackHostOnly refuses, with 403, every request whose Host is not
	// a loopback name: localhost, an address of 127.0.0.0/8 or [::1], with
	// any port. Dev mode sets it: a web page the developer visits can point
	// a name of its own at 127.0.0.1 (DNS rebinding) and so reach a dev
	// server listening on loopback from the browser, same-origin, with the
	// Host of that name; a dev server mints tokens (/dev/token) and trusts
	// a public secret, so such a page could act as an admin. Default: false.
	LoopbackHostOnly bool

	// BodyTimeout bounds how long a client may take to send a request's
	// body, counted from the end of its headers: a body still incomplete
	// then is cut off (the GraphQL handler answers 408) and its connection
	// closed, so a client trickling a byte now and then cannot hold a
	// request open. Once the body has been read the bound is lifted: it
	// never cuts a long answer or a stream. Default: 10s.
	BodyTimeout time.Duration

	// RequestsPerAddr caps the requests in flight from one client address
	// (ClientAddr, IPv6 per /64); one more is answered 429 with
	// Retry-After at once, without reading its body. Websocket upgrades and
	// SSE streams (Accept: text/event-stream) are not counted: they live
	// long, and the GraphQL handler caps them per address itself. The cap
	// is per process. Default: 1024.
	RequestsPerAddr int

	// IdleTimeout closes idle keep-alive connections. Default: 120s.
	IdleTimeout time.Duration

	// MaxHeaderBytes bounds request headers. Default: 64 KiB.
	MaxHeaderBytes int

	// CheckTimeout bounds each readiness check. Default: 1s.
	CheckTimeout time.Duration

	// Tracer, when set, makes every request continue the trace its W3C
	// traceparent header names (the GraphQL handler makes the operation's
	// span under it). Nil (tracing off) leaves the header alone and adds
	// nothing to a request. Default: nil.
	Tracer trace.TracerProvider

	// NoMetrics leaves /metrics off this listener (to the catch-all's
	// 404): the admin listener serves it instead. Default: false.
	NoMetrics bool

	// ClientAddr decides each request's client address (for the access log
	// and the GraphQL stream caps), believing forwarding headers only from
	// the proxies it trusts. Default: the zero Resolver, which trusts none:
	// the client is the TCP peer.
	ClientAddr clientaddr.Resolver
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.RequestsPerAddr <= 0 {
		c.RequestsPerAddr = DefaultRequestsPerAddr
	}
	return c
}

// Server is the HTTP server, a startstop.Service. Build it with New, start
// it with Start, stop it with Stop (from startstop.Base); the caller bounds
// the shutdown with the context it passes to Stop. Done and Err (also from
// startstop.Base) tell when and why it stopped serving on its own.
type Server struct {
	startstop.Base
	cfg     Config
	log     zerolog.Logger
	handler http.Handler
	http    *http.Server

	// baseCtx is the parent of every request context. It is cancelled after
	// Stop has drained ordinary requests, which ends hijacked connections
	// (GraphQL subscriptions over websockets) that http.Server.Shutdown does
	// not wait for.
	baseCtx    context.Context
	cancelBase context.CancelFunc

	mu sync.Mutex
	ln net.Listener
}

// New builds the Server and its handler. It does not listen yet.
func New(cfg Config) *Server {
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger}
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.handler = s.routes()
	s.http = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		// No ReadTimeout/WriteTimeout: they would cut websocket
		// subscriptions and SSE streams. ReadHeaderTimeout bounds slow
		// headers, bodyDeadline slow bodies (BodyTimeout), the GraphQL
		// handler their size.
		ErrorLog:    log.New(httpErrorLog{cfg.Logger}, "", 0),
		BaseContext: func(net.Listener) context.Context { return s.baseCtx },
	}
	return s
}

// Start binds Config.Addr and serves in the background. It returns once the
// listener is bound, so Addr is valid as soon as Start returns; a bind
// failure (port in use) is returned here. ctx bounds the bind only: the
// server serves until Stop. A server starts once; a second Start is refused.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return errors.New("server already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.cfg.Addr, err)
	}
	s.ln = ln
	s.Go(context.WithoutCancel(ctx), s.serve)
	return nil
}

// serve serves until Stop, then stops accepting connections, waits for
// in-flight requests until the context of Stop ends, closes whatever is left
// and cancels the context of hijacked (websocket) connections. When serving
// fails on its own, every connection is closed and the failure returned
// (Err).
func (s *Server) serve(ctx context.Context) error {
	return serveHTTP(ctx, s.http, s.ln, "HTTP server", s.cancelBase)
}

// serveHTTP is the run of a listener's service: it serves ln with srv until
// ctx ends, then shuts srv down within startstop.StopContext (closing what is
// left when that ends first) and calls drained. A failure of Serve closes
// every connection and is returned.
func serveHTTP(ctx context.Context, srv *http.Server, ln net.Listener, name string, drained func()) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		_ = srv.Close()
		drained()
		return fmt.Errorf("serving the %s on %s: %w", name, ln.Addr(), err)
	case <-ctx.Done():
	}
	err := srv.Shutdown(startstop.StopContext(ctx))
	drained()
	if err != nil {
		// The deadline passed with requests still running: cut them.
		_ = srv.Close()
		err = fmt.Errorf("shutting down the %s: %w", name, err)
	}
	<-served //nolint:errcheck // ErrServerClosed, after Shutdown or Close
	return err
}

// Addr returns the bound address ("127.0.0.1:41234") once Start succeeded,
// or the configured one before.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr().String()
	}
	return s.cfg.Addr
}

// httpErrorLog sends net/http's internal messages (TLS handshake errors,
// panics in hijacked connections) to zerolog instead of stderr.
type httpErrorLog struct{ log zerolog.Logger }

func (w httpErrorLog) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	w.log.Warn().Str("component", "http").Msg(msg)
	return len(p), nil
}
