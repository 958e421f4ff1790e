// Command bench-floor serves the floors the benchmarks divide by (see
// bench/floor) on a loopback address until interrupted:
//
//	bench-floor http ADDR   net/http + gqlgen, reserve returns a fixed reservation
//	bench-floor bare ADDR   net/http alone, every POST answered with the sold-out answer
//	bench-floor ws ADDR     a websocket broadcaster of one frame to every socket
//
// `make bench-http` and `make watchers` build and start it themselves.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dropline/dropline/bench/floor"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: bench-floor http|bare|ws 127.0.0.1:PORT")
		os.Exit(2)
	}
	var h http.Handler
	switch os.Args[1] {
	case "http":
		h = floor.HTTPHandler()
	case "bare":
		h = floor.BareHandler()
	case "ws":
		h = floor.NewBroadcaster().Handler()
	default:
		fmt.Fprintln(os.Stderr, "usage: bench-floor http|bare|ws 127.0.0.1:PORT")
		os.Exit(2)
	}
	host, _, err := net.SplitHostPort(os.Args[2])
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintln(os.Stderr, "bench-floor: listens on a loopback address only")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: os.Args[2], Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "bench-floor: %v\n", err)
		os.Exit(1)
	}
}
