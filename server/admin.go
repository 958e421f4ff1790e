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

	"github.com/rs/zerolog"
)

// AdminConfig is what NewAdmin needs.
type AdminConfig struct {
	// Addr is the admin listen address, e.g. "127.0.0.1:6060"; port 0 picks
	// a free port (see AdminServer.Addr). Whether it may be non-loopback is
	// the configuration's decision (config.Validate), not this package's.
	Addr string
	// Logger receives net/http's own messages.
	Logger zerolog.Logger
}

// AdminServer is the operators' listener, apart from the public one: the Go
// profiler (net/http/pprof) under /debug/pprof/. It is a separate listener
// so that the profiler is never reachable through the public port, whatever
// a proxy in front forwards, and so that it can stay on loopback while the
// API listens everywhere. It serves its own mux, not http.DefaultServeMux.
type AdminServer struct {
	cfg  AdminConfig
	http *http.Server

	mu   sync.Mutex
	ln   net.Listener
	done chan struct{}
	once sync.Once
	err  error
}

// NewAdmin builds the admin server. It does not listen yet.
func NewAdmin(cfg AdminConfig) *AdminServer {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &AdminServer{
		cfg: cfg,
		http: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: DefaultReadHeaderTimeout,
			// No WriteTimeout: a CPU profile or a trace streams for as long
			// as its ?seconds= asks.
			ErrorLog: log.New(httpErrorLog{cfg.Logger}, "", 0),
		},
		done: make(chan struct{}),
	}
}

// Open binds Config.Addr and serves in the background; it returns once the
// listener is bound.
func (a *AdminServer) Open(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		return errors.New("admin server already open")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", a.cfg.Addr, err)
	}
	a.ln = ln
	go func() {
		_ = a.http.Serve(ln)
		close(a.done)
	}()
	return nil
}

// Addr returns the bound address once Open succeeded, or the configured one.
func (a *AdminServer) Addr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		return a.ln.Addr().String()
	}
	return a.cfg.Addr
}

// Shutdown stops the listener, waiting for running requests until ctx ends
// (a profile in progress is then cut). Idempotent; safe if never opened.
func (a *AdminServer) Shutdown(ctx context.Context) error {
	a.once.Do(func() {
		a.mu.Lock()
		opened := a.ln != nil
		a.mu.Unlock()
		if err := a.http.Shutdown(ctx); err != nil {
			_ = a.http.Close()
			a.err = fmt.Errorf("shutting down the admin server: %w", err)
		}
		if opened {
			<-a.done
		}
	})
	return a.err
}
