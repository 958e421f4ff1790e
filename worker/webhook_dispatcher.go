package worker

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/webhook"
)

// The webhook dispatcher's defaults, exported so the program's configuration
// refers to them instead of repeating them.
const (
	DefaultWebhookTimeout     = 10 * time.Second
	DefaultWebhookConcurrency = 4
	DefaultWebhookMaxAttempts = 12
	DefaultWebhookBackoff     = time.Second
	DefaultWebhookBackoffMax  = time.Hour
	DefaultWebhookRetention   = 7 * 24 * time.Hour
)

// WebhookDispatcherConfig tunes the webhook dispatcher. Zero values take the
// defaults named on each field.
type WebhookDispatcherConfig struct {
	Options
	// Poll is the time between looks for due deliveries; default 200
	// milliseconds, most of the delay between a sale and its webhook.
	Poll time.Duration
	// Timeout bounds one attempt at one endpoint; default 10 seconds.
	Timeout time.Duration
	// Concurrency is how many deliveries this process sends to one endpoint
	// at once (each of a different product); default 4.
	Concurrency int
	// MaxAttempts is how many attempts a delivery gets before it is a dead
	// letter; default 12.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait before a retry, which doubles
	// per failed attempt; defaults 1 second and 1 hour (12 attempts then
	// span about 2 hours).
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// BacklogInterval is how often the backlog gauges are read; default 5
	// seconds.
	BacklogInterval time.Duration
	// Retention is how long a delivery that ended (delivered, or a dead
	// letter nobody redelivered) and its event are kept; default 7 days.
	// Every PruneInterval the dispatcher deletes older ones, PruneBatch
	// rows per statement, so the tables stay bounded by what a shop sends
	// in that time.
	Retention time.Duration
	// PruneInterval is how often older deliveries are deleted; default 1
	// minute.
	PruneInterval time.Duration
	// PruneBatch bounds the rows one delete takes; default 1,000. A pass
	// deletes at most 20 batches of each.
	PruneBatch int
}

func (c *WebhookDispatcherConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Poll <= 0 {
		c.Poll = 200 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultWebhookTimeout
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultWebhookConcurrency
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultWebhookMaxAttempts
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultWebhookBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(DefaultWebhookBackoffMax, c.MinBackoff)
	}
	if c.BacklogInterval <= 0 {
		c.BacklogInterval = 5 * time.Second
	}
	if c.Retention <= 0 {
		c.Retention = DefaultWebhookRetention
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = time.Minute
	}
	if c.PruneBatch <= 0 {
		c.PruneBatch = 1000
	}
}

// WebhookDispatcher sends the webhook outbox (migration 0014, package
// webhook) to its endpoints. Every process runs one, and they share the
// work through the ledger: a delivery is claimed (SKIP LOCKED, with a claim
// that outlasts one attempt) before it is sent, so it is in flight in one
// process at a time, and only the oldest pending delivery of each product
// and endpoint can be claimed, so one product's events reach an endpoint in
// the order the ledger recorded them. An attempt that fails waits a
// doubling backoff; after MaxAttempts the delivery is a dead letter until an
// admin redelivers it. A process that dies mid-send leaves its claim to
// lapse, and the delivery is sent again (at least once: a receiver drops
// duplicates by webhook-id).
//
// Sending never holds up anything else: each attempt runs in a goroutine of
// its own under Timeout, at most Concurrency per endpoint, so an endpoint
// that hangs uses up its own slots and nothing of the others', of the
// write-behind or of a reserve (which never reads the outbox).
type WebhookDispatcher struct {
	*service
	cfg    WebhookDispatcherConfig
	ledger *db.Ledger
	sender *webhook.Sender

	mu       sync.Mutex
	inflight map[int64]int              // endpoint id -> attempts in flight
	signers  map[string]*webhook.Signer // secret -> its signer
	sends    sync.WaitGroup
	// wake asks for a pass before the next poll: an attempt finished, so
	// its product's next event may be due.
	wake chan struct{}

	attempts    *prometheus.CounterVec
	dead        *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	pending     *prometheus.GaugeVec
	deadWaiting *prometheus.GaugeVec
	lag         *prometheus.GaugeVec
	pruned      *prometheus.CounterVec
	// measured is the endpoints the backlog gauges were last set for (read
	// and written by run's goroutine alone).
	measured map[string]bool

	// attempted signals, to a test, each attempt once its outcome is
	// recorded.
	attempted testsignal.Signal[WebhookAttemptReport]
}

// WebhookAttemptReport is one attempt, as the dispatcher's test signal
// tells it.
type WebhookAttemptReport struct {
	Endpoint, Event int64
	Result          webhook.Result
	// Status is the delivery's status afterwards ("" when the outcome was
	// not recorded).
	Status string
}

// NewWebhookDispatcher builds a dispatcher; Start runs it.
func NewWebhookDispatcher(cfg WebhookDispatcherConfig, ledger *db.Ledger, log zerolog.Logger, reg prometheus.Registerer) *WebhookDispatcher {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &WebhookDispatcher{
		cfg: cfg, ledger: ledger,
		sender:   webhook.NewSender(webhook.SenderConfig{Timeout: cfg.Timeout}),
		inflight: map[int64]int{}, signers: map[string]*webhook.Signer{}, wake: make(chan struct{}, 1),
		attempts: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_webhook_attempts_total",
			Help: "Webhook delivery attempts by endpoint and outcome: delivered (2xx), failed (retried later) or dead (the last attempt failed).",
		}, []string{"endpoint", "outcome"})),
		dead: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_webhook_dead_letters_total",
			Help: "Webhook deliveries that ran out of attempts and became dead letters, by endpoint.",
		}, []string{"endpoint"})),
		seconds: prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dropline_webhook_attempt_seconds",
			Help:    "How long one webhook delivery attempt took, by outcome.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"})),
		pending: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_webhook_pending",
			Help: "Webhook deliveries waiting to be sent (or retried), by endpoint.",
		}, []string{"endpoint"})),
		deadWaiting: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_webhook_dead_letters",
			Help: "Dead letters waiting for a redelivery, by endpoint.",
		}, []string{"endpoint"})),
		lag: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_webhook_lag_seconds",
			Help: "Age of the oldest pending webhook delivery, by endpoint (0 when none is pending).",
		}, []string{"endpoint"})),
		pruned: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_webhook_pruned_total",
			Help: "Webhook rows deleted after the retention (DROPLINE_WEBHOOK_RETENTION), by table: deliveries or events.",
		}, []string{"table"})),
	}
	w.service = newService("webhook-dispatcher", cfg.Options, log, reg, nil, w.run)
	return w
}

// run looks for due deliveries every Poll, and reads the backlog every
// BacklogInterval. On a stop it claims nothing more and waits for the
// attempts in flight, each bounded by Timeout.
func (w *WebhookDispatcher) run(ctx context.Context) error {
	defer w.sends.Wait()
	poll := time.NewTicker(w.cfg.Poll)
	defer poll.Stop()
	var lastBacklog, lastPrune time.Time
	for {
		w.pass(ctx)
		if time.Since(lastBacklog) >= w.cfg.BacklogInterval {
			lastBacklog = time.Now()
			w.measure(ctx)
		}
		if time.Since(lastPrune) >= w.cfg.PruneInterval {
			lastPrune = time.Now()
			w.prune(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		case <-w.wake:
		}
	}
}

// claimFor is how long a claim lasts: longer than an attempt and the
// recording of its outcome, so a live sender's claim never lapses.
func (w *WebhookDispatcher) claimFor() time.Duration {
	return w.cfg.Timeout + 2*w.cfg.StepTimeout
}

// pass claims what each enabled endpoint has due, up to its free slots, and
// starts an attempt for each. One endpoint's failure to claim is logged and
// the others go on.
func (w *WebhookDispatcher) pass(ctx context.Context) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	endpoints, err := w.ledger.Webhooks().WebhookEndpoints(sctx, true)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("listing webhook endpoints (retried next poll)")
		}
		return
	}
	for _, e := range endpoints {
		if ctx.Err() != nil {
			return
		}
		free := w.cfg.Concurrency - w.inFlight(e.ID)
		if free <= 0 {
			continue
		}
		signer, err := w.signer(e.Secrets(time.Now()))
		if err != nil {
			w.log.Error().Int64("endpoint", e.ID).Msg("webhook endpoint has an unusable secret; not sending to it")
			continue
		}
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		due, err := w.ledger.Webhooks().ClaimWebhookDeliveries(sctx, e.ID, w.cfg.Owner, free, w.claimFor())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Int64("endpoint", e.ID).Msg("claiming webhook deliveries (retried next poll)")
			}
			continue
		}
		for _, d := range due {
			w.mu.Lock()
			w.inflight[e.ID]++
			w.mu.Unlock()
			w.sends.Add(1)
			go w.attempt(ctx, e, signer, d)
		}
	}
}

func (w *WebhookDispatcher) inFlight(endpoint int64) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight[endpoint]
}

// signer returns the signer of an endpoint's secrets (the current one,
// and the previous while it still signs), made once.
func (w *WebhookDispatcher) signer(secrets []string) (*webhook.Signer, error) {
	id := strings.Join(secrets, " ")
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.signers[id]; ok {
		return s, nil
	}
	s, err := webhook.NewSigner(secrets[0], secrets[1:]...)
	if err != nil {
		return nil, err
	}
	if len(w.signers) > 4*db.MaxWebhookEndpoints {
		clear(w.signers) // secrets rotated away
	}
	w.signers[id] = s
	return s, nil
}

// attempt sends one claimed delivery and records the outcome. The send
// outlives a stop (it is bounded by Timeout), so that what an endpoint
// received is recorded as delivered.
func (w *WebhookDispatcher) attempt(ctx context.Context, e db.WebhookEndpoint, signer *webhook.Signer, d db.WebhookDelivery) {
	defer w.sends.Done()
	defer func() {
		w.mu.Lock()
		w.inflight[e.ID]--
		if w.inflight[e.ID] <= 0 {
			delete(w.inflight, e.ID)
		}
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}()
	began := time.Now()
	res := w.sender.Send(context.WithoutCancel(ctx), e.URL, signer, webhook.Message{ID: webhook.MessageID(d.EventID), Body: d.Payload})
	took := time.Since(began)

	rctx, cancel := stepContext(context.WithoutCancel(ctx), w.cfg.StepTimeout)
	status, err := w.ledger.Webhooks().RecordWebhookAttempt(rctx, e.ID, d.EventID, w.cfg.Owner, db.WebhookAttempt{
		Delivered: res.Delivered, Status: res.Status, Error: res.Error,
		RetryIn: backoff(w.cfg.MinBackoff, w.cfg.MaxBackoff, d.Attempts), MaxAttempts: w.cfg.MaxAttempts,
	})
	cancel()
	endpoint := strconv.FormatInt(e.ID, 10)
	outcome := "failed"
	switch {
	case res.Delivered:
		outcome = "delivered"
	case status == db.WebhookDead:
		outcome = "dead"
		w.dead.WithLabelValues(endpoint).Inc()
	}
	w.attempts.WithLabelValues(endpoint, outcome).Inc()
	w.seconds.WithLabelValues(outcome).Observe(took.Seconds())
	log := w.log.With().Int64("endpoint", e.ID).Str("webhook_id", webhook.MessageID(d.EventID)).Str("type", d.Type).
		Str("sku", d.SKU).Int("attempt", d.Attempts+1).Dur("took", took).Logger()
	switch {
	case err != nil:
		// The claim lapses and the delivery is attempted again.
		log.Warn().Err(err).Bool("delivered", res.Delivered).Msg("recording a webhook attempt failed")
	case outcome == "dead":
		log.Warn().Int("status", res.Status).Str("error", res.Error).Msg("webhook delivery is a dead letter")
	case !res.Delivered:
		log.Info().Int("status", res.Status).Str("error", res.Error).Msg("webhook delivery failed; retried later")
	}
	w.attempted.Signal(WebhookAttemptReport{Endpoint: e.ID, Event: d.EventID, Result: res, Status: status})
}

// prune deletes what ended longer than Retention ago, a batch at a time,
// at most 20 batches a pass. Every instance prunes; the deletes are
// idempotent, so two at once only share the work.
func (w *WebhookDispatcher) prune(ctx context.Context) {
	for range 20 {
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		deliveries, events, err := w.ledger.Webhooks().PruneWebhooks(sctx, w.cfg.Retention, w.cfg.PruneBatch)
		cancel()
		w.pruned.WithLabelValues("deliveries").Add(float64(deliveries))
		w.pruned.WithLabelValues("events").Add(float64(events))
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("pruning old webhook deliveries (retried next interval)")
			}
			return
		}
		if deliveries < w.cfg.PruneBatch && events < w.cfg.PruneBatch {
			return
		}
	}
}

// measure sets the backlog gauges from the ledger. Each endpoint's gauges
// are set in place and those of an endpoint no longer listed are deleted
// afterwards, so a scrape never finds a listed endpoint without its series.
func (w *WebhookDispatcher) measure(ctx context.Context) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	backlogs, err := w.ledger.Webhooks().WebhookBacklogs(sctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("reading the webhook backlog")
		}
		return
	}
	listed := make(map[string]bool, len(backlogs))
	for _, b := range backlogs {
		endpoint := strconv.FormatInt(b.EndpointID, 10)
		listed[endpoint] = true
		w.pending.WithLabelValues(endpoint).Set(float64(b.Pending))
		w.deadWaiting.WithLabelValues(endpoint).Set(float64(b.Dead))
		lag := 0.0
		if !b.OldestPending.IsZero() {
			lag = max(time.Since(b.OldestPending).Seconds(), 0)
		}
		w.lag.WithLabelValues(endpoint).Set(lag)
	}
	for endpoint := range w.measured {
		if !listed[endpoint] {
			w.pending.DeleteLabelValues(endpoint)
			w.deadWaiting.DeleteLabelValues(endpoint)
			w.lag.DeleteLabelValues(endpoint)
		}
	}
	w.measured = listed
}
