package webhook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SenderConfig tunes a Sender. Zero values take the defaults named on each
// field.
type SenderConfig struct {
	// Timeout bounds one delivery, from dialling to the end of the answer's
	// headers; default 10 seconds. An endpoint that takes longer has failed
	// that attempt.
	Timeout time.Duration
	// UserAgent is sent with every delivery; default "Dropline-Webhooks/1".
	UserAgent string
}

// Sender posts signed messages. It follows no redirect (a 3xx is a failed
// attempt) and reads at most errorBodyBytes of an answer.
type Sender struct {
	cfg    SenderConfig
	client *http.Client
}

// errorBodyBytes is how much of a failed answer's body is kept to tell the
// operator what the endpoint said.
const errorBodyBytes = 256

// NewSender builds a Sender with a connection pool of its own.
func NewSender(cfg SenderConfig) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "Dropline-Webhooks/1"
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &Sender{cfg: cfg, client: &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
}

// Timeout is the bound of one delivery.
func (s *Sender) Timeout() time.Duration { return s.cfg.Timeout }

// Message is one delivery's content.
type Message struct {
	// ID is the webhook-id: the same for every attempt at one event, so a
	// receiver can drop a duplicate.
	ID   string
	Body []byte
}

// Result is the outcome of one attempt.
type Result struct {
	// Delivered: the endpoint answered 2xx.
	Delivered bool
	// Status is the HTTP status, 0 when there was none.
	Status int
	// Error says why it failed; "" when delivered.
	Error string
}

// Send posts one message to url, signed now with signer, within the
// sender's timeout (or ctx's end, if sooner).
func (s *Sender) Send(ctx context.Context, url string, signer *Signer, m Message) Result {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(m.Body))
	if err != nil {
		return Result{Error: "bad request: " + err.Error()}
	}
	now := time.Now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", s.cfg.UserAgent)
	req.Header.Set(HeaderID, m.ID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, signer.Sign(m.ID, now, m.Body))
	resp, err := s.client.Do(req)
	if err != nil {
		return Result{Error: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Result{Delivered: true, Status: resp.StatusCode}
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if text := strings.TrimSpace(strings.ToValidUTF8(string(head), "")); text != "" {
		msg += ": " + text
	}
	return Result{Status: resp.StatusCode, Error: msg}
}
