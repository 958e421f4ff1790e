package server

import (
	"net/http"
	"strings"
	"sync"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/header"
)

// inFlight caps the requests in flight per client address
// (Config.RequestsPerAddr). Each request holds a goroutine, its buffers
// and, in the GraphQL handler, its body until it is answered; without a
// cap one address could open as many as the process can accept.
type inFlight struct {
	max int

	mu sync.Mutex
	n  map[string]int
}

func newInFlight(max int) *inFlight {
	return &inFlight{max: max, n: map[string]int{}}
}

// middleware counts each request under its address' key for as long as
// it runs, and refuses one over the cap with 429 before reading its body.
// Streams are not counted (isStream).
func (f *inFlight) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isStream(r) {
			next.ServeHTTP(w, r)
			return
		}
		key := clientaddr.Key(r)
		if !f.acquire(key) {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, r, http.StatusTooManyRequests, errorBody{Error: "too many requests in flight from this address"})
			return
		}
		defer f.release(key)
		next.ServeHTTP(w, r)
	})
}

func (f *inFlight) acquire(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] >= f.max {
		return false
	}
	f.n[key]++
	return true
}

func (f *inFlight) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] <= 1 {
		delete(f.n, key) // the map holds only addresses with requests in flight
		return
	}
	f.n[key]--
}

// isStream reports whether r opens a stream that outlives an ordinary
// request: a websocket upgrade, or an SSE subscription.
func isStream(r *http.Request) bool {
	return header.Get(r.Header, "Upgrade") != "" || strings.Contains(header.Get(r.Header, "Accept"), "text/event-stream")
}
