package server

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/startstop"
)

// AdminConfig is what NewAdmin needs.
type AdminConfig struct {
	// Addr is the admin listen address, e.g. "127.0.0.1:6060"; port 0 picks
	// a free port (see AdminServer.Addr). Whether it may be non-loopback is
	// the configuration's decision (config.Validate), not this package's.
	Addr string
	// Logger receives net/http's own messages.
	Logger zerolog.Logger
	// Checks are the readiness checks of the public /readyz; the admin
	// listener's /readyz runs them too and names each failure. Empty
	// means always ready.
	Checks []Check
	// CheckTimeout bounds each check. Default: DefaultCheckTimeout.
	CheckTimeout time.Duration
	// Registry, when set, is served on /metrics here (and the public
	// listener is then told NoMetrics): the sales and reserve rates stay
	// off the API's port. Nil: no /metrics here.
	Registry *prometheus.Registry
}

// AdminServer is the operators' listener, apart from the public one: the Go
// profiler (net/http/pprof) under /debug/pprof/, and /readyz with the
// reason of each failure, which the public /readyz keeps to itself. It is a separate listener
// so that the profiler is never reachable through the public port, whatever
// a proxy in front forwards, and so that it can stay on loopback while the
// API listens everywhere. It serves its own mux, not http.DefaultServeMux.
//
// It is a startstop.Service: Start binds and serves, Stop (from
// startstop.Base) waits for running requests until its context ends (a
// profile in progress is then cut).
type AdminServer struct {
	startstop.Base
	cfg  AdminConfig
	http *http.Server

	mu sync.Mutex
	ln net.Listener
}

// NewAdmin builds the admin server. It does not listen yet.
func NewAdmin(cfg AdminConfig) *AdminServer {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	mux.Handle("GET /readyz", readyHandler(cfg.Checks, cfg.CheckTimeout, true))
	if cfg.Registry != nil {
		mux.Handle("GET /metrics", metricsHandler(cfg.Registry, cfg.Logger))
	}
	return &AdminServer{
		cfg: cfg,
		http: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: DefaultReadHeaderTimeout,
			// No WriteTimeout: a CPU profile or a trace streams for as long
			// as its ?seconds= asks.
			ErrorLog: log.New(httpErrorLog{cfg.Logger}, "", 0),
		},
	}
}

// Start binds Config.Addr and serves in the background until Stop; it
// returns once the listener is bound. A second Start is refused.
func (a *AdminServer) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		return errors.New("admin server already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", a.cfg.Addr, err)
	}
	a.ln = ln
	a.Go(context.WithoutCancel(ctx), func(ctx context.Context) error {
		return serveHTTP(ctx, a.http, ln, "admin server", func() {})
	})
	return nil
}

// Addr returns the bound address once Start succeeded, or the configured one.
func (a *AdminServer) Addr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		return a.ln.Addr().String()
	}
	return a.cfg.Addr
}
