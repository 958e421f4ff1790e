// Package webhooktest is a real HTTP receiver of Dropline's webhooks for
// tests: it verifies every signature with the Standard Webhooks reference
// library, answers as the test scripts it (2xx, 500, hang past the
// sender's timeout), can go away and come back on the same address, and
// records what it accepted.
package webhooktest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Answer is how the receiver answers one request.
type Answer int

// The answers a test can script.
const (
	// Accept records the message and answers 204.
	Accept Answer = iota
	// Fail answers 500 and records nothing.
	Fail
	// Hang holds the request until the sender gives up (or 30 s), and
	// records nothing.
	Hang
)

// Received is one message the receiver accepted.
type Received struct {
	ID        string
	Timestamp string
	Body      []byte
	// Type and SKU are read from the body ({type, data: {sku}}).
	Type string
	SKU  string
	At   time.Time
}

// Receiver is a webhook endpoint on a loopback port.
type Receiver struct {
	// URL is where it listens.
	URL string

	addr   string
	verify *standardwebhooks.Webhook
	decide func(id string, attempt int) Answer

	mu       sync.Mutex
	srv      *http.Server
	attempts map[string]int
	accepted []Received
	bad      []string
	requests int
}

// New starts a receiver for secret ("": SetSecret gives it before the
// first request). decide scripts the answer to each request (attempt
// counts the requests for one webhook-id, from 1); nil accepts everything.
// It stops when the test ends.
func New(t testing.TB, secret string, decide func(id string, attempt int) Answer) *Receiver {
	t.Helper()
	if decide == nil {
		decide = func(string, int) Answer { return Accept }
	}
	r := &Receiver{decide: decide, attempts: map[string]int{}}
	if secret != "" {
		r.SetSecret(t, secret)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("webhook receiver: %v", err)
	}
	r.addr = ln.Addr().String()
	r.URL = "http://" + r.addr + "/hooks"
	r.serve(ln)
	t.Cleanup(r.Stop)
	return r
}

// SetSecret makes the receiver verify with secret (one Dropline made).
func (r *Receiver) SetSecret(t testing.TB, secret string) {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatalf("webhook receiver: %v", err)
	}
	r.mu.Lock()
	r.verify = wh
	r.mu.Unlock()
}

func (r *Receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(r.handle), ReadHeaderTimeout: 5 * time.Second}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// Stop closes the receiver: from now on, connections to it are refused.
func (r *Receiver) Stop() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Restart listens again on the address it had.
func (r *Receiver) Restart(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the old socket may linger a moment
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("webhook receiver: listening again on %s: %v", r.addr, err)
	}
	r.serve(ln)
}

func (r *Receiver) handle(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	verify := r.verify
	r.mu.Unlock()
	err = errors.New("no secret to verify with")
	if verify != nil {
		err = verify.Verify(body, req.Header)
	}
	if err != nil {
		r.mu.Lock()
		r.bad = append(r.bad, id+": "+err.Error())
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	r.mu.Lock()
	r.requests++
	r.attempts[id]++
	n := r.attempts[id]
	r.mu.Unlock()
	switch r.decide(id, n) {
	case Fail:
		http.Error(w, "failing on purpose", http.StatusInternalServerError)
		return
	case Hang:
		ctx, cancel := context.WithTimeout(req.Context(), 30*time.Second)
		defer cancel()
		<-ctx.Done()
		return
	case Accept:
	}
	var msg struct {
		Type string `json:"type"`
		Data struct {
			SKU string `json:"sku"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &msg)
	r.mu.Lock()
	r.accepted = append(r.accepted, Received{ID: id, Timestamp: req.Header.Get("webhook-timestamp"), Body: body,
		Type: msg.Type, SKU: msg.Data.SKU, At: time.Now()})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Accepted returns what the receiver accepted, in the order it arrived
// (a message delivered twice is there twice).
func (r *Receiver) Accepted() []Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Received(nil), r.accepted...)
}

// Requests is how many correctly signed requests arrived, whatever the
// answer.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// BadSignatures lists the requests whose signature did not verify.
func (r *Receiver) BadSignatures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}
