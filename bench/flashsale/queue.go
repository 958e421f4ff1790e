package flashsale

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dropline/dropline/internal/machine"
	"github.com/dropline/dropline/inventory/queue"
)

// ModeQueue is the rehearsal of a queued drop: the drop, then RunQueue.
const ModeQueue = "queue"

// Bounds on the queue rehearsal.
const (
	MaxQueuePeople   = 20_000
	MaxQueueBotConns = 8
)

// The abuses the queue rehearsal's bots try, each refused with its code
// (QueueResult.Abuses counts what came back).
const (
	AbuseNoProof      = "join without a proof of work"
	AbuseWrongProof   = "join with a proof that does not solve"
	AbuseOthersProof  = "join with another principal's solved challenge"
	AbuseUsedCode     = "join with another principal's access code"
	AbuseNoPass       = "reserve without a pass"
	AbuseForgedPass   = "reserve with a forged pass"
	AbuseOthersPass   = "reserve with another principal's pass"
	AbuseSpentPass    = "reserve again with its spent pass"
	AbuseExpiredPass  = "reserve with its expired pass"
	queueOutBought    = "bought"
	queueOutSoldOut   = "told SOLD_OUT"
	queueOutExpired   = "pass expired unused"
	queueOutUnserved  = "still waiting at the end"
	queueOutJoinError = "join failed"
)

// abuseCode is the code each abuse must be refused with.
var abuseCode = map[string]string{
	AbuseNoProof: "PROOF_INVALID", AbuseWrongProof: "PROOF_INVALID", AbuseOthersProof: "PROOF_INVALID",
	AbuseUsedCode: "ACCESS_CODE_INVALID", AbuseNoPass: "QUEUE_REQUIRED", AbuseForgedPass: "PASS_INVALID",
	AbuseOthersPass: "PASS_INVALID", AbuseSpentPass: "PASS_INVALID", AbuseExpiredPass: "PASS_EXPIRED",
}

// QueueResult is what the queue rehearsal (--mode queue) measured: a SKU of
// Stock units sold behind an admission queue, People principals joining it
// (Early of them before opensAt) and watching queueChanged over websockets
// or polling myQueueTicket, Bots principals joining and abusing it, and the
// outcome as the principals, Redis and the ledger see it.
type QueueResult struct {
	SKU            string `json:"sku"`
	Stock          int    `json:"stock"`
	Servers        int    `json:"servers"`
	People         int    `json:"people"`
	Pollers        int    `json:"pollers"`
	Bots           int    `json:"bots"`
	BotConns       int    `json:"botConns"`
	PowBits        int    `json:"proofOfWorkBits"`
	PassSeconds    int    `json:"passSeconds"`
	AdmitPerMinute int    `json:"admitPerMinute"`
	AccessCodes    bool   `json:"accessCodes"`
	// Early principals joined before opensAt, Late after it.
	Early int `json:"early"`
	Late  int `json:"late"`
	// PreQueue, Tickets and AdmittedThrough are the ledger's.
	PreQueue        int `json:"preQueue"`
	Tickets         int `json:"tickets"`
	AdmittedThrough int `json:"admittedThrough"`
	// EarlySeconds is how long the early joins took, all in flight
	// together; SellSeconds from opensAt to the last sale.
	EarlySeconds float64 `json:"earlySeconds"`
	SellSeconds  float64 `json:"sellSeconds"`
	JoinP99ms    float64 `json:"joinP99ms"`
	// PeopleUnits and BotUnits are the units sold to each, from the
	// ledger; BotBound the most the bots may have within sampling error.
	PeopleUnits int     `json:"peopleUnits"`
	BotUnits    int     `json:"botUnits"`
	BotBound    float64 `json:"botBound"`
	// Outcomes counts each principal's end, people and bots apart.
	PeopleOutcomes map[string]int `json:"peopleOutcomes"`
	BotOutcomes    map[string]int `json:"botOutcomes"`
	// Abuses counts, per abuse, the codes that came back.
	Abuses map[string]map[string]int `json:"abuses"`
	// RepeatJoins is how many joins the bots sent after their first;
	// RepeatSame how many answered the first's ticket.
	RepeatJoins int `json:"repeatJoins"`
	RepeatSame  int `json:"repeatSame"`
	// Watching is the people's websocket subscriptions, Told those told
	// SOLD_OUT, SoldOutLate the delay from the last sale to each.
	Watching    int       `json:"watching"`
	Told        int       `json:"told"`
	SoldOutLate Quantiles `json:"soldOutLate"`
	// PollersWaiting is the pollers still waiting at the sale's end,
	// PollersTold those whose poll said SOLD_OUT.
	PollersWaiting int       `json:"pollersWaiting"`
	PollersTold    int       `json:"pollersTold"`
	Final          Stock     `json:"finalStock"`
	LedgerChecked  bool      `json:"ledgerChecked"`
	Verification   string    `json:"verification,omitempty"`
	LoadAvg        string    `json:"loadAvg"`
	Checks         []Check   `json:"checks"`
	StartedAt      time.Time `json:"startedAt"`
	ElapsedSeconds float64   `json:"elapsedSeconds"`
}

// QueueEvidence is what the queue verdict judges: what the principals saw
// and what Redis (through the API) and the ledger hold afterwards.
type QueueEvidence struct {
	// Bots maps every principal of the run to whether it is a bot.
	Bots map[string]bool
	// Early is the principals whose join was answered before opensAt.
	Early map[string]bool
	// Numbers is the ticket number the API gave each principal (0: none
	// seen); Conflicts the principals whose answers disagreed.
	Numbers   map[string]int64
	Conflicts []string
	// Abuses counts, per abuse, the codes that came back.
	Abuses map[string]map[string]int
	// RepeatJoins and RepeatSame as in QueueResult.
	RepeatJoins, RepeatSame int
	// Holds maps every hold the principals got to its principal;
	// Committed and Unknown as Observed's; APIStatus each hold's status
	// read back through the API (Redis).
	Holds     map[string]string
	Committed map[string]int
	Unknown   map[string]int
	APIStatus map[string]string
	// Samples are the live stock read every 100 ms while the queue sold.
	Samples []StockSample
	// LastSale is when the last commit's answer arrived; Told when each
	// websocket waiter received SOLD_OUT (zero: never).
	LastSale time.Time
	Told     []time.Time
	// API is the final live stock, APIAdmittedThrough and APISeed the
	// queue's as the API reports them.
	API                Stock
	APIAdmittedThrough int
	APISeed            string
	// Ledger is the SKU's ledger state (nil without the ledger), Settled
	// as in VerdictInput, Queue the queue's rows.
	Ledger  *LedgerState
	Settled bool
	Queue   *LedgerQueue
}

// LedgerQueue is a queue's rows in the ledger.
type LedgerQueue struct {
	Seed            []byte
	SeedHash        string
	PreQueueSize    int
	AdmittedThrough int
	Tickets         []LedgerTicket
	Admits          []LedgerAdmit
	Holds           []LedgerHold
}

// LedgerTicket is a queue_tickets row; Number 0 is none.
type LedgerTicket struct {
	Principal     string
	Number        int64
	PreQueue      bool
	Pass          string
	AdmittedAt    time.Time
	PassExpiresAt time.Time
	SpentAt       time.Time
	SpentFor      string
}

// LedgerAdmit is a qadmit row of queue_movements: the numbers one step
// admitted.
type LedgerAdmit struct {
	First, Last int64
	At          time.Time
}

// LedgerHold is a reservations row of the queued SKU.
type LedgerHold struct {
	Token, Principal, Status string
	CreatedAt                time.Time
}

// QueueTicket is the schema's QueueTicket as the rehearsal reads it.
type QueueTicket struct {
	Number           *int64     `json:"number"`
	Status           string     `json:"status"`
	Pass             *string    `json:"pass"`
	PassExpiresAt    *time.Time `json:"passExpiresAt"`
	PollAfterSeconds int        `json:"pollAfterSeconds"`
}

// QueueInfo is a product's queue and live stock.
type QueueInfo struct {
	Stock Stock `json:"stock"`
	Queue *struct {
		Status          string  `json:"status"`
		AdmittedThrough int     `json:"admittedThrough"`
		Waiting         int     `json:"waiting"`
		SeedHash        string  `json:"seedHash"`
		Seed            *string `json:"seed"`
	} `json:"queue"`
}

// QueueChallenge is the schema's QueueChallenge.
type QueueChallenge struct {
	Challenge string    `json:"challenge"`
	Bits      int       `json:"bits"`
	ExpiresAt time.Time `json:"expiresAt"`
}

const (
	ticketFields      = `number status pass passExpiresAt pollAfterSeconds`
	queueChallengeDoc = `query C($sku: ID) { queueChallenge(sku: $sku) { challenge bits expiresAt } }`
	joinQueueDoc      = `mutation J($input: JoinQueueInput!) { joinQueue(input: $input) { ticket { ` + ticketFields + ` }
  userErrors { code field message retryAfterSeconds } } }`
	myQueueTicketDoc = `query T($sku: ID) { myQueueTicket(sku: $sku) { ` + ticketFields + ` } }`
	queueInfoDoc     = `query Q($sku: ID!) { product(sku: $sku) { stock { available held sold total } queue { status admittedThrough waiting seedHash seed } } }`
	queueChangedDoc  = `subscription W($sku: ID) { queueChanged(sku: $sku) { status admittedThrough waiting } }`
	reservationDoc   = `query R($t: ID!) { reservation(token: $t) { token status quantity expiresAt } }`
)

// QueueChallenge asks for a proof-of-work challenge of sku's queue.
func (c *Client) QueueChallenge(ctx context.Context, bearer, sku string) (QueueChallenge, error) {
	var out struct {
		QueueChallenge QueueChallenge `json:"queueChallenge"`
	}
	err := c.do(ctx, bearer, queueChallengeDoc, map[string]any{"sku": sku}, &out)
	return out.QueueChallenge, err
}

// JoinInput is what a join brings.
type JoinInput struct {
	SKU, Challenge, Proof, AccessCode string
}

// JoinQueue takes (or returns) the bearer's ticket of sku's queue.
func (c *Client) JoinQueue(ctx context.Context, bearer string, in JoinInput) (QueueTicket, *UserError, error) {
	input := map[string]any{"sku": in.SKU}
	for k, v := range map[string]string{"challenge": in.Challenge, "proof": in.Proof, "accessCode": in.AccessCode} {
		if v != "" {
			input[k] = v
		}
	}
	var out struct {
		JoinQueue struct {
			Ticket     *QueueTicket `json:"ticket"`
			UserErrors []UserError  `json:"userErrors"`
		} `json:"joinQueue"`
	}
	if err := c.do(ctx, bearer, joinQueueDoc, map[string]any{"input": input}, &out); err != nil {
		return QueueTicket{}, nil, err
	}
	if ue := out.JoinQueue.UserErrors; len(ue) > 0 {
		return QueueTicket{}, &ue[0], nil
	}
	if out.JoinQueue.Ticket == nil {
		return QueueTicket{}, nil, &CallError{Code: CodeBadReply, Err: errors.New("joinQueue: neither ticket nor userErrors")}
	}
	return *out.JoinQueue.Ticket, nil, nil
}

// MyQueueTicket reads the bearer's ticket of sku's queue; nil when none.
func (c *Client) MyQueueTicket(ctx context.Context, bearer, sku string) (*QueueTicket, error) {
	var out struct {
		MyQueueTicket *QueueTicket `json:"myQueueTicket"`
	}
	err := c.do(ctx, bearer, myQueueTicketDoc, map[string]any{"sku": sku}, &out)
	return out.MyQueueTicket, err
}

// Queue reads sku's queue and live stock.
func (c *Client) Queue(ctx context.Context, sku string) (QueueInfo, error) {
	var out struct {
		Product *QueueInfo `json:"product"`
	}
	if err := c.do(ctx, "", queueInfoDoc, map[string]any{"sku": sku}, &out); err != nil {
		return QueueInfo{}, err
	}
	if out.Product == nil || out.Product.Queue == nil {
		return QueueInfo{}, fmt.Errorf("%s: no such product behind a queue", sku)
	}
	return *out.Product, nil
}

// Reservation reads a hold by its token as its holder.
func (c *Client) Reservation(ctx context.Context, bearer, token string) (*Reservation, error) {
	var out struct {
		Reservation *Reservation `json:"reservation"`
	}
	err := c.do(ctx, bearer, reservationDoc, map[string]any{"t": token}, &out)
	return out.Reservation, err
}

// queueWaiter is one websocket subscription of queueChanged: the newest
// state it received, and when SOLD_OUT first came.
type queueWaiter struct {
	c       *watchConn
	mu      sync.Mutex
	status  string
	through int64
	told    time.Time
	err     error
	changed chan struct{} // a value of capacity 1: something arrived
	first   chan struct{} // closed on the first value
}

func (w *queueWaiter) run() {
	firstDone := false
	defer func() {
		if !firstDone {
			close(w.first)
		}
	}()
	for {
		msg, err := w.c.nextMessage()
		now := time.Now()
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			w.poke()
			return
		}
		var m struct {
			Payload struct {
				Data struct {
					QueueChanged struct {
						Status          string `json:"status"`
						AdmittedThrough int64  `json:"admittedThrough"`
					} `json:"queueChanged"`
				} `json:"data"`
				Errors []json.RawMessage `json:"errors"`
			} `json:"payload"`
		}
		err = json.Unmarshal(msg, &m)
		if err == nil && len(m.Payload.Errors) > 0 {
			err = fmt.Errorf("subscription error: %.200s", m.Payload.Errors[0])
		}
		w.mu.Lock()
		if err != nil {
			w.err = err
		} else {
			q := m.Payload.Data.QueueChanged
			w.status = q.Status
			w.through = max(w.through, q.AdmittedThrough)
			if q.Status == "SOLD_OUT" && w.told.IsZero() {
				w.told = now
			}
		}
		w.mu.Unlock()
		if !firstDone {
			firstDone = true
			close(w.first)
		}
		w.poke()
	}
}

func (w *queueWaiter) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *queueWaiter) state() (status string, through int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status, w.through, w.err
}

// queueRun is what the principals of one queue rehearsal share.
type queueRun struct {
	d        *Driver
	res      *QueueResult
	sku      string
	opensAt  time.Time
	deadline time.Time
	st       *buyerState // the recorder, the commits and their unknown outcomes

	mu        sync.Mutex
	numbers   map[string]int64
	conflicts []string
	early     map[string]bool
	holds     map[string]string // token -> principal
	bearers   map[string]string // principal -> bearer
	abuses    map[string]map[string]int
	lastSale  time.Time
	repeat    int
	repeatOK  int
	proofs    []JoinInput // people's solved joins, for the bots to replay
	stolen    string      // a person's pass, for the bots to try
	sleeper   atomic.Bool // a bot already keeps its pass until it expires
	pollWait  int
	pollTold  int
	joinMs    []float64
	principal []string // index -> principal: people first, then bots
}

func (q *queueRun) isBot(i int) bool { return i >= q.res.People }

func (q *queueRun) client(i int) *Client { return q.d.clients[i%len(q.d.clients)] }

func (q *queueRun) abuse(kind, code string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.abuses[kind] == nil {
		q.abuses[kind] = map[string]int{}
	}
	q.abuses[kind][code]++
}

// sawNumber records a number the API gave principal (0: none yet).
func (q *queueRun) sawNumber(who string, t QueueTicket) {
	if t.Number == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if old, ok := q.numbers[who]; ok && old != 0 && old != *t.Number {
		q.conflicts = append(q.conflicts, fmt.Sprintf("%s (%d, then %d)", who, old, *t.Number))
	}
	q.numbers[who] = *t.Number
}

func (q *queueRun) accessCode(i int) string {
	if !q.res.AccessCodes {
		return ""
	}
	return "code-" + q.d.cfg.RunID + "-" + strconv.Itoa(i)
}

// RunQueue rehearses a queued drop (G15 in docs/design.md) over GraphQL
// against every target: a fresh SKU of Stock units behind an admission
// queue opening QueueWindow after its creation. People principals join
// once, QueueEarly of them before the opening, and watch queueChanged over
// a websocket each (or, QueuePollers of them, poll myQueueTicket every
// pollAfterSeconds); admitted, each reserves with its pass and commits.
// Bots principals open QueueBotConns subscriptions each, join that many
// times at once, and try every abuse: a join without a proof, with a wrong
// one and with another principal's, with a used access code, a reserve
// without a pass, with a forged one, with another principal's, with its
// own spent one, and (the first bot admitted) with its expired one; an
// admitted bot also buys. JudgeQueue adds the checks, reading the ledger.
func (d *Driver) RunQueue(ctx context.Context) (*QueueResult, error) {
	cfg := d.cfg
	res := &QueueResult{SKU: "QUEUE-" + cfg.RunID, Stock: cfg.Stock, Servers: len(d.clients), People: cfg.QueuePeople,
		Bots: cfg.QueueBots, BotConns: cfg.QueueBotConns, PowBits: cfg.QueuePowBits, PassSeconds: cfg.QueuePassSeconds,
		AdmitPerMinute: cfg.QueueAdmitPerMinute, AccessCodes: cfg.QueueAccessCodes, StartedAt: time.Now(),
		PeopleOutcomes: map[string]int{}, BotOutcomes: map[string]int{}}
	res.Pollers = int(float64(res.People) * cfg.QueuePollers)
	n := res.People + res.Bots
	q := &queueRun{d: d, res: res, sku: res.SKU,
		st:      &buyerState{rec: &recorder{start: time.Now()}, outcomes: map[string]int{}, committed: map[string]int{}, unknown: map[string]int{}},
		numbers: map[string]int64{}, early: map[string]bool{}, holds: map[string]string{}, bearers: map[string]string{},
		abuses: map[string]map[string]int{}, proofs: make([]JoinInput, res.People), joinMs: make([]float64, n)}
	for i := range n {
		who := fmt.Sprintf("q-%s-p%05d", cfg.RunID, i)
		if q.isBot(i) {
			who = fmt.Sprintf("q-%s-b%05d", cfg.RunID, i-res.People)
		}
		b, err := d.issuer.Mint(who, false, time.Hour)
		if err != nil {
			return nil, err
		}
		q.principal = append(q.principal, who)
		q.bearers[who] = b
	}

	// The product, its queue opening QueueWindow from now.
	admin, err := d.issuer.Mint("flashsale-admin", true, time.Hour)
	if err != nil {
		return nil, err
	}
	q.opensAt = time.Now().Add(cfg.QueueWindow).Truncate(time.Second).Add(time.Second)
	q.deadline = q.opensAt.Add(cfg.Duration)
	spec := map[string]any{"opensAt": q.opensAt.UTC().Format(time.RFC3339), "admitPerMinute": res.AdmitPerMinute,
		"passSeconds": res.PassSeconds, "proofOfWorkBits": res.PowBits}
	if res.AccessCodes {
		codes := make([]string, n)
		for i := range codes {
			codes[i] = q.accessCode(i)
		}
		spec["accessCodes"] = codes
	}
	var created struct {
		CreateProduct struct {
			UserErrors []UserError `json:"userErrors"`
		} `json:"createProduct"`
	}
	input := map[string]any{"sku": res.SKU, "name": "Queue rehearsal " + cfg.RunID, "stock": cfg.Stock, "maxPerUser": 1,
		"price": map[string]any{"amount": 100, "currency": "EUR"}, "queue": spec}
	if err := d.clients[0].do(ctx, admin, createDrawDoc, map[string]any{"input": input}, &created); err != nil {
		return nil, fmt.Errorf("creating %s: %w", res.SKU, err)
	}
	if ue := created.CreateProduct.UserErrors; len(ue) > 0 {
		return nil, callFailed("creating "+res.SKU, &ue[0], nil)
	}

	// The subscriptions: one per person who does not poll, BotConns per
	// bot, spread over the servers and over loopback source addresses.
	waiters := make([][]*queueWaiter, n)
	var conns []*queueWaiter
	for i := range n {
		k := 1
		switch {
		case q.isBot(i):
			k = res.BotConns
		case i < res.Pollers:
			k = 0
		}
		for range k {
			w := &queueWaiter{changed: make(chan struct{}, 1), first: make(chan struct{})}
			waiters[i] = append(waiters[i], w)
			conns = append(conns, w)
		}
	}
	d.watchStatus("queue: %d principals (%d people, %d polling; %d bots), %d subscriptions over %d server(s)",
		n, res.People, res.Pollers, res.Bots, len(conns), len(d.clients))
	var wg sync.WaitGroup // the subscriptions' readers
	defer func() {
		for _, w := range conns {
			if w.c != nil {
				w.c.close()
			}
		}
		wg.Wait()
	}()
	addrs := min(MaxSourceAddrs, (len(conns)+PerSourceAddr-1)/PerSourceAddr)
	payload, err := subscribePayload(queueChangedDoc, map[string]any{"sku": res.SKU})
	if err != nil {
		return nil, err
	}
	err = parallel(len(conns), 64, func(i int) error {
		c, err := dialSubscription(ctx, d.clients[i%len(d.clients)].Endpoint, net.IPv4(127, 0, 0, byte(2+i%max(1, addrs))),
			TransportWS, payload, cfg.Timeout)
		if err != nil {
			return fmt.Errorf("subscribing queueChanged: %w", err)
		}
		conns[i].c = c
		wg.Add(1)
		go func() { defer wg.Done(); conns[i].run() }()
		return nil
	})
	if err != nil {
		return nil, err
	}
	firstBy := time.After(cfg.Timeout + 30*time.Second)
	for _, w := range conns {
		select {
		case <-w.first:
		case <-firstBy:
			return nil, errors.New("a queueChanged subscription got no first value in time")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if _, _, err := w.state(); err != nil {
			return nil, fmt.Errorf("a queueChanged subscription: %w", err)
		}
	}

	// Who joins before the opening: every person and bot whose index
	// falls in the early share, people first (the bots replay their
	// proofs).
	early := func(i int) bool {
		k := i
		if q.isBot(i) {
			k = i - res.People
		}
		return float64(k%100) < cfg.QueueEarly*100
	}
	order := make([]int, 0, n)
	for i := range n {
		if early(i) {
			order = append(order, i)
		}
	}
	res.Early = len(order)
	res.Late = n - res.Early
	d.watchStatus("queue: %d principals join the pre-queue of %s before %s", res.Early, res.SKU, q.opensAt.UTC().Format(time.TimeOnly))
	t0 := time.Now()
	err = parallel(len(order), cfg.Concurrency, func(k int) error { return q.join(ctx, order[k]) })
	res.EarlySeconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, fmt.Errorf("joining the pre-queue of %s: %w", res.SKU, err)
	}
	if time.Now().After(q.opensAt) {
		return nil, fmt.Errorf("the pre-queue joins took %.1fs, past the opening: raise --queue-window", res.EarlySeconds)
	}
	for _, i := range order {
		q.early[q.principal[i]] = true
	}

	// From the opening every principal plays its part; the late ones join
	// first, spread over the first second.
	sleep(ctx, time.Until(q.opensAt))
	var samples []StockSample
	stopSampler, samplerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if info, ok, err := d.clients[0].Product(ctx, res.SKU); err == nil && ok {
				samples = append(samples, StockSample{T: time.Since(q.opensAt).Seconds(), Stock: info.Stock})
			}
			select {
			case <-stopSampler:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	outcomes := make([]string, n)
	var pg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, cfg.Concurrency)
	for i := range n {
		pg.Add(1)
		go func() {
			defer pg.Done()
			if !early(i) {
				sleep(ctx, time.Duration(i%1000)*time.Millisecond)
				sem <- struct{}{}
				err := q.join(ctx, i)
				<-sem
				if err != nil {
					outcomes[i] = queueOutJoinError
					errs <- err
					return
				}
			}
			var err error
			if len(waiters[i]) == 0 {
				outcomes[i], err = q.poll(ctx, i)
			} else {
				outcomes[i], err = q.watch(ctx, i, waiters[i][0])
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	pg.Wait()
	close(stopSampler)
	<-samplerDone
	close(errs)
	var runErrs []error
	for err := range errs {
		runErrs = append(runErrs, err)
	}
	if err := errors.Join(runErrs...); err != nil {
		return nil, fmt.Errorf("queue rehearsal: %w", err)
	}
	for i, o := range outcomes {
		if q.isBot(i) {
			res.BotOutcomes[o]++
		} else {
			res.PeopleOutcomes[o]++
		}
	}
	res.SellSeconds = q.lastSale.Sub(q.opensAt).Seconds()
	res.JoinP99ms = p99(q.joinMs)
	res.LoadAvg = machine.LoadAverage()

	// Every people's subscription must have been told SOLD_OUT: give the
	// last ones a second past the deadline of the check.
	ev := QueueEvidence{Bots: map[string]bool{}, Early: q.early, Numbers: q.numbers, Conflicts: q.conflicts,
		Abuses: q.abuses, RepeatJoins: q.repeat, RepeatSame: q.repeatOK, Holds: q.holds,
		Committed: q.st.committed, Unknown: q.st.unknown, APIStatus: map[string]string{}, LastSale: q.lastSale,
		Samples: samples}
	for i, who := range q.principal {
		ev.Bots[who] = q.isBot(i)
	}
	waitTold := time.Now().Add(2 * time.Second)
	for i := range res.People {
		for _, w := range waiters[i] {
			for {
				w.mu.Lock()
				told, werr := w.told, w.err
				w.mu.Unlock()
				if !told.IsZero() || werr != nil || time.Now().After(waitTold) {
					ev.Told = append(ev.Told, told)
					break
				}
				select {
				case <-w.changed:
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}
	res.PollersWaiting, res.PollersTold = q.pollWait, q.pollTold

	// Redis, through the API: every hold read back by its holder.
	var apiMu sync.Mutex
	tokens := make([]string, 0, len(q.holds))
	for tok := range q.holds {
		tokens = append(tokens, tok)
	}
	err = parallel(len(tokens), cfg.Concurrency, func(k int) error {
		tok := tokens[k]
		r, err := d.clients[k%len(d.clients)].Reservation(ctx, q.bearers[q.holds[tok]], tok)
		if err != nil {
			return fmt.Errorf("reading hold %s: %w", tok, err)
		}
		st := "(none)"
		if r != nil {
			st = r.Status
		}
		apiMu.Lock()
		ev.APIStatus[tok] = st
		apiMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}

	final, ledger, settled, err := d.drain(ctx, res.SKU, nil)
	if err != nil {
		return nil, err
	}
	info, err := d.clients[0].Queue(ctx, res.SKU)
	if err != nil {
		return nil, err
	}
	res.Final, ev.API, ev.APIAdmittedThrough, ev.Ledger, ev.Settled = final, final, info.Queue.AdmittedThrough, ledger, settled
	if d.ledger != nil {
		lq, err := d.ledger.WaitQueue(ctx, res.SKU, len(q.numbers), info.Queue.AdmittedThrough, len(q.holds), d.cfg.DrainTimeout)
		if err != nil {
			return nil, err
		}
		ev.Queue = lq
		res.LedgerChecked = true
	}
	if info.Queue.Seed != nil {
		ev.APISeed = *info.Queue.Seed
	}
	res.Checks = JudgeQueue(res, ev)
	res.ElapsedSeconds = time.Since(res.StartedAt).Seconds()
	return res, nil
}

// join takes principal i's ticket: a bot first tries the joins that must be
// refused, then joins BotConns times at once.
func (q *queueRun) join(ctx context.Context, i int) error {
	who, c := q.principal[i], q.client(i)
	bearer := q.bearers[who]
	in := JoinInput{SKU: q.sku, AccessCode: q.accessCode(i)}
	if q.res.PowBits > 0 {
		ch, err := c.QueueChallenge(ctx, bearer, q.sku)
		if err != nil {
			return fmt.Errorf("%s: queueChallenge: %w", who, err)
		}
		in.Challenge = ch.Challenge
		in.Proof = queue.Solve(queue.Challenge{Challenge: ch.Challenge, Bits: ch.Bits})
	}
	if q.isBot(i) {
		q.mu.Lock()
		person := q.proofs[(i-q.res.People)%q.res.People] // set once that person has joined
		q.mu.Unlock()
		if q.res.PowBits > 0 {
			wrong := in
			for p := 0; ; p++ {
				if wrong.Proof = "x" + strconv.Itoa(p); queue.LeadingZeroBits(in.Challenge, wrong.Proof) < q.res.PowBits {
					break
				}
			}
			noProof := in
			noProof.Challenge, noProof.Proof = "", ""
			q.tryJoin(ctx, c, bearer, AbuseNoProof, noProof)
			q.tryJoin(ctx, c, bearer, AbuseWrongProof, wrong)
			if person.Proof != "" {
				others := person
				others.AccessCode = in.AccessCode
				q.tryJoin(ctx, c, bearer, AbuseOthersProof, others)
			}
		}
		if q.res.AccessCodes && person.SKU != "" {
			// The person's code is claimed: the bot's join must not take it.
			used := in
			used.AccessCode = person.AccessCode
			q.tryJoin(ctx, c, bearer, AbuseUsedCode, used)
		}
	}
	// A person joins once; a bot BotConns times at once, each over a
	// connection of its own.
	k := 1
	if q.isBot(i) {
		k = q.res.BotConns
	}
	tickets := make([]QueueTicket, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	t0 := time.Now()
	for j := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cj := c
			if j > 0 {
				cj = NewClient(q.client(i+j).Endpoint, 1, q.d.cfg.Timeout)
				defer cj.Close()
			}
			code := q.d.attempt(ctx, q.st, "join", func() (*UserError, error) {
				t, ue, err := cj.JoinQueue(ctx, bearer, in)
				tickets[j] = t
				return ue, err
			})
			if code != CodeOK {
				errs[j] = fmt.Errorf("%s: joinQueue: %s", who, code)
			}
		}()
	}
	wg.Wait()
	q.joinMs[i] = float64(time.Since(t0).Microseconds()) / 1000
	if err := errors.Join(errs...); err != nil {
		return err
	}
	q.mu.Lock()
	if !q.isBot(i) {
		q.proofs[i] = in
	}
	for _, t := range tickets[1:] {
		q.repeat++
		if sameTicket(t, tickets[0]) {
			q.repeatOK++
		}
	}
	q.mu.Unlock()
	q.sawNumber(who, tickets[0])
	if q.isBot(i) {
		// A bot tries to buy before it is admitted.
		q.tryReserve(ctx, c, bearer, AbuseNoPass, "")
		var forged [16]byte
		_, _ = rand.Read(forged[:])
		q.tryReserve(ctx, c, bearer, AbuseForgedPass, hex.EncodeToString(forged[:]))
	}
	return nil
}

func sameTicket(a, b QueueTicket) bool {
	return a.Status == b.Status && (a.Number == nil) == (b.Number == nil) && (a.Number == nil || *a.Number == *b.Number)
}

// tryJoin sends a join that must be refused and counts what came back.
func (q *queueRun) tryJoin(ctx context.Context, c *Client, bearer, kind string, in JoinInput) {
	code := q.d.attempt(ctx, q.st, "join", func() (*UserError, error) {
		_, ue, err := c.JoinQueue(ctx, bearer, in)
		return ue, err
	})
	q.abuse(kind, code)
}

// tryReserve sends a reserve that must be refused and counts what came
// back; a hold it got anyway is recorded with the others (the verdict then
// finds it).
func (q *queueRun) tryReserve(ctx context.Context, c *Client, bearer, kind, pass string) {
	var hold Reservation
	code := q.d.attempt(ctx, q.st, OpReserve, func() (*UserError, error) {
		r, ue, err := c.Reserve(ctx, bearer, ReserveInput{SKU: q.sku, Quantity: 1, AdmissionPass: pass})
		hold = r
		return ue, err
	})
	if code == CodeOK {
		q.mu.Lock()
		for who, b := range q.bearers {
			if b == bearer {
				q.holds[hold.Token] = who
			}
		}
		q.mu.Unlock()
	}
	q.abuse(kind, code)
}

// watch is a websocket principal once the queue is open: it learns its
// number, waits until admittedThrough reaches it, then buys with its pass;
// it stops when it has bought, or its subscription says SOLD_OUT. A bot
// also tries another principal's pass as soon as one is about.
func (q *queueRun) watch(ctx context.Context, i int, w *queueWaiter) (string, error) {
	who, c := q.principal[i], q.client(i)
	bearer := q.bearers[who]
	stoleTried := false
	var number int64
	for {
		status, through, err := w.state()
		if err != nil {
			return "", fmt.Errorf("%s: queueChanged: %w", who, err)
		}
		if q.isBot(i) && !stoleTried {
			q.mu.Lock()
			pass := q.stolen
			q.mu.Unlock()
			if pass != "" {
				stoleTried = true
				q.tryReserve(ctx, c, bearer, AbuseOthersPass, pass)
			}
		}
		switch {
		case status == "SOLD_OUT" || status == "CLOSED":
			return queueOutSoldOut, nil
		case status == "PRE_QUEUE" || status == "":
		case number == 0 || through >= number:
			t, err := c.MyQueueTicket(ctx, bearer, q.sku)
			if err != nil {
				return "", fmt.Errorf("%s: myQueueTicket: %w", who, err)
			}
			if t == nil {
				return "", fmt.Errorf("%s: myQueueTicket: no ticket", who)
			}
			q.sawNumber(who, *t)
			if t.Number != nil {
				number = *t.Number
			}
			if out, done := q.ticketSays(ctx, i, *t); done {
				return out, nil
			}
		}
		if time.Now().After(q.deadline) {
			return queueOutUnserved, nil
		}
		select {
		case <-w.changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// poll is a polling principal once the queue is open: myQueueTicket every
// pollAfterSeconds until it is admitted (and buys), or SOLD_OUT.
func (q *queueRun) poll(ctx context.Context, i int) (string, error) {
	who, c := q.principal[i], q.client(i)
	for {
		t, err := c.MyQueueTicket(ctx, q.bearers[who], q.sku)
		if err != nil {
			return "", fmt.Errorf("%s: myQueueTicket: %w", who, err)
		}
		if t == nil {
			return "", fmt.Errorf("%s: myQueueTicket: no ticket", who)
		}
		q.sawNumber(who, *t)
		out, done := q.ticketSays(ctx, i, *t)
		if out == queueOutSoldOut {
			q.mu.Lock()
			q.pollTold++
			q.pollWait++
			q.mu.Unlock()
		}
		if done {
			return out, nil
		}
		if time.Now().After(q.deadline) {
			q.mu.Lock()
			q.pollWait++
			q.mu.Unlock()
			return queueOutUnserved, nil
		}
		sleep(ctx, time.Duration(max(1, t.PollAfterSeconds))*time.Second)
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
}

// ticketSays acts on a ticket: an admitted one buys (or, for the first bot
// admitted, keeps its pass until it has expired); done says the principal
// has nothing more to wait for.
func (q *queueRun) ticketSays(ctx context.Context, i int, t QueueTicket) (string, bool) {
	switch t.Status {
	case "SOLD_OUT":
		return queueOutSoldOut, true
	case "EXPIRED":
		return queueOutExpired, true
	case "USED":
		return queueOutBought, true
	case "ADMITTED":
	default:
		return "", false
	}
	who, c := q.principal[i], q.client(i)
	bearer, pass := q.bearers[who], ""
	if t.Pass != nil {
		pass = *t.Pass
	}
	if q.isBot(i) && t.PassExpiresAt != nil && q.sleeper.CompareAndSwap(false, true) {
		sleep(ctx, time.Until(*t.PassExpiresAt)+500*time.Millisecond)
		q.tryReserve(ctx, c, bearer, AbuseExpiredPass, pass)
		return queueOutExpired, true
	}
	if !q.isBot(i) {
		q.mu.Lock()
		if q.stolen == "" {
			q.stolen = pass
		}
		q.mu.Unlock()
	}
	var hold Reservation
	key := "queue-" + q.d.cfg.RunID + "-" + who
	code := q.d.attempt(ctx, q.st, OpReserve, func() (*UserError, error) {
		r, ue, err := c.Reserve(ctx, bearer, ReserveInput{SKU: q.sku, Quantity: 1, IdempotencyKey: key,
			HoldSeconds: int(q.d.cfg.Hold / time.Second), AdmissionPass: pass})
		hold = r
		return ue, err
	})
	if code != CodeOK {
		return "reserve refused: " + code, true
	}
	q.mu.Lock()
	q.holds[hold.Token] = who
	q.mu.Unlock()
	tries := 0
	code = q.d.attempt(ctx, q.st, OpCommit, func() (*UserError, error) {
		tries++
		_, ue, err := c.Commit(ctx, bearer, hold.Token)
		if ue != nil && ue.Code == "ALREADY_COMMITTED" && tries > 1 {
			return nil, nil
		}
		return ue, err
	})
	q.mu.Lock()
	defer func() {
		q.mu.Unlock()
		if q.isBot(i) {
			q.tryReserve(ctx, c, bearer, AbuseSpentPass, pass)
		}
	}()
	switch {
	case code == CodeOK:
		q.st.committed[hold.Token] = hold.Quantity
		if now := time.Now(); now.After(q.lastSale) {
			q.lastSale = now
		}
		return queueOutBought, true
	case retryable(code):
		q.st.unknown[hold.Token] = hold.Quantity
		return "commit outcome unknown", true
	}
	return "commit refused: " + code, true
}

// WaitQueue reads queue sku:<sku>'s rows, waiting (up to timeout) until the
// write-behind has brought the tickets, the admissions and the spent passes
// the API reported: tickets rows, admittedThrough, and spent passes (one
// per hold). It returns the last reading either way; the verdict judges it.
func (r *LedgerReader) WaitQueue(ctx context.Context, sku string, tickets, through, spent int, timeout time.Duration) (*LedgerQueue, error) {
	deadline := time.Now().Add(timeout)
	for {
		lq, err := r.ReadQueue(ctx, sku)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, t := range lq.Tickets {
			if t.SpentFor != "" {
				n++
			}
		}
		if (len(lq.Tickets) >= tickets && lq.AdmittedThrough >= through && n >= spent) || time.Now().After(deadline) {
			return lq, nil
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// ReadQueue reads the ledger's rows of queue sku:<sku> and the SKU's
// reservations in one snapshot, with SQL of its own.
func (r *LedgerReader) ReadQueue(ctx context.Context, sku string) (*LedgerQueue, error) {
	id := "sku:" + sku
	lq := &LedgerQueue{}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
		return nil, err
	}
	var pre *int64
	var through int64
	if err := tx.QueryRow(ctx, `SELECT seed, seed_hash, pre_queue_size, admitted_through FROM queues WHERE id = $1`, id).
		Scan(&lq.Seed, &lq.SeedHash, &pre, &through); err != nil {
		return nil, fmt.Errorf("reading queue %s: %w", id, err)
	}
	if pre != nil {
		lq.PreQueueSize = int(*pre)
	}
	lq.AdmittedThrough = int(through)
	rows, err := tx.Query(ctx, `SELECT principal, coalesce(number, 0), pre_queue, coalesce(pass, ''),
		coalesce(admitted_at, 'epoch'), coalesce(pass_expires_at, 'epoch'), coalesce(spent_at, 'epoch'), coalesce(spent_for, '')
		FROM queue_tickets WHERE queue_id = $1 ORDER BY number NULLS LAST, principal`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var t LedgerTicket
		if err := rows.Scan(&t.Principal, &t.Number, &t.PreQueue, &t.Pass, &t.AdmittedAt, &t.PassExpiresAt, &t.SpentAt, &t.SpentFor); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Tickets = append(lq.Tickets, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT first_number, last_number, occurred_at FROM queue_movements
		WHERE queue_id = $1 AND kind = 'qadmit' ORDER BY occurred_at, first_number`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var a LedgerAdmit
		if err := rows.Scan(&a.First, &a.Last, &a.At); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Admits = append(lq.Admits, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT token, principal, status, created_at FROM reservations WHERE sku = $1 ORDER BY created_at`, sku)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var h LedgerHold
		if err := rows.Scan(&h.Token, &h.Principal, &h.Status, &h.CreatedAt); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Holds = append(lq.Holds, h)
	}
	return lq, rows.Err()
}

// soldOutCheckBound is how soon every waiter must learn SOLD_OUT (G15).
const soldOutCheckBound = time.Second

// JudgeQueue checks a queue rehearsal: admissions in ticket order (the
// ledger's passes are numbers 1..admittedThrough, admitted in that order,
// the admission steps contiguous); the pre-queue numbered as the
// verification `dropline verify-queue` runs recomputes it from the revealed
// seed (queue.CheckPreQueueOrder); no hold without a valid pass (every hold
// in the ledger spent an admitted, unexpired pass of its own principal);
// one ticket per principal; no unit oversold and Redis and the ledger
// agreeing hold by hold (Judge's checks, and each hold's status through the
// API); every websocket waiter told SOLD_OUT within a second of the last
// sale; the bots' units within a binomial 3-sigma bound of their share of
// principals; and every abuse refused with its code.
func JudgeQueue(res *QueueResult, ev QueueEvidence) []Check {
	var checks []Check
	add := func(name string, ok bool, format string, args ...any) {
		checks = append(checks, Check{Name: "queue: " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	skip := func(name string) {
		checks = append(checks, Check{Name: "queue: " + name, Skipped: true, Detail: "ledger not read (--no-ledger)"})
	}
	lq := ev.Queue
	if lq != nil {
		res.PreQueue, res.Tickets, res.AdmittedThrough = lq.PreQueueSize, len(lq.Tickets), lq.AdmittedThrough
	}

	// Admissions in ticket order.
	if lq == nil {
		skip("admissions in ticket order")
	} else {
		var bad []string
		var prev time.Time
		passes := 0
		for _, t := range lq.Tickets {
			switch {
			case t.Pass != "" && (t.Number < 1 || t.Number > int64(lq.AdmittedThrough)):
				bad = append(bad, fmt.Sprintf("%s holds a pass at number %d, past %d", t.Principal, t.Number, lq.AdmittedThrough))
			case t.Pass == "" && t.Number >= 1 && t.Number <= int64(lq.AdmittedThrough):
				bad = append(bad, fmt.Sprintf("number %d (%s) admitted without a pass", t.Number, t.Principal))
			case t.Pass != "" && t.AdmittedAt.Before(prev):
				bad = append(bad, fmt.Sprintf("number %d admitted at %s, before a number ahead of it", t.Number, t.AdmittedAt.Format(time.StampMilli)))
			}
			if t.Pass != "" {
				passes++
				prev = t.AdmittedAt
			}
		}
		next := int64(1)
		for _, a := range lq.Admits {
			if a.First != next || a.Last < a.First {
				bad = append(bad, fmt.Sprintf("a step admitted %d-%d after %d", a.First, a.Last, next-1))
			}
			next = max(next, a.Last+1)
		}
		if next-1 != int64(lq.AdmittedThrough) || passes != lq.AdmittedThrough || ev.APIAdmittedThrough != lq.AdmittedThrough {
			bad = append(bad, fmt.Sprintf("steps admitted through %d, %d passes, ledger through %d, API through %d",
				next-1, passes, lq.AdmittedThrough, ev.APIAdmittedThrough))
		}
		add("admissions in ticket order", len(bad) == 0, "numbers 1-%d admitted in %d steps, each from the number after the last, admitted_at rising with the number%s",
			lq.AdmittedThrough, len(lq.Admits), sample(bad))
	}

	// The pre-queue, recomputed as verify-queue does.
	if lq == nil {
		skip("pre-queue order equals verify-queue's recomputation")
	} else {
		var members, bad []string
		for _, t := range lq.Tickets {
			inPre := t.Number >= 1 && t.Number <= int64(lq.PreQueueSize)
			if inPre != t.PreQueue {
				bad = append(bad, fmt.Sprintf("%s: number %d, pre_queue %v", t.Principal, t.Number, t.PreQueue))
			}
			if inPre {
				members = append(members, t.Principal)
			}
			if t.PreQueue != ev.Early[t.Principal] {
				bad = append(bad, fmt.Sprintf("%s: pre_queue %v, joined before the opening %v", t.Principal, t.PreQueue, ev.Early[t.Principal]))
			}
		}
		err := queue.CheckPreQueueOrder(lq.Seed, lq.SeedHash, members)
		if err == nil {
			res.Verification = fmt.Sprintf("queue sku:%s verified: %d pre-queue tickets numbered as seed %.16s... gives", res.SKU, len(members), lq.SeedHash)
		} else {
			res.Verification = err.Error()
		}
		if ev.APISeed != hex.EncodeToString(lq.Seed) {
			bad = append(bad, fmt.Sprintf("the API revealed the seed %q, not the ledger's", ev.APISeed))
		}
		if len(ev.Early) != lq.PreQueueSize || len(members) != lq.PreQueueSize {
			bad = append(bad, fmt.Sprintf("%d joined before the opening, the ledger's pre-queue is %d with %d numbered", len(ev.Early), lq.PreQueueSize, len(members)))
		}
		add("pre-queue order equals verify-queue's recomputation", err == nil && len(bad) == 0, "%s%s", res.Verification, sample(bad))
	}

	// No hold without a valid pass, row by row.
	if lq == nil {
		skip("no hold without a valid pass")
	} else {
		spentFor := map[string]LedgerTicket{}
		spent := 0
		for _, t := range lq.Tickets {
			if t.SpentFor != "" {
				spent++
				spentFor[t.SpentFor] = t
			}
		}
		var bad []string
		for _, h := range lq.Holds {
			t, ok := spentFor[h.Token]
			switch {
			case !ok:
				bad = append(bad, h.Token+" spent no pass")
			case t.Principal != h.Principal:
				bad = append(bad, fmt.Sprintf("%s (%s) spent %s's pass", h.Token, h.Principal, t.Principal))
			case t.Pass == "" || t.Number < 1:
				bad = append(bad, h.Token+" spent a ticket without a pass")
			case h.CreatedAt.Before(t.AdmittedAt) || t.SpentAt.After(t.PassExpiresAt) || h.CreatedAt.After(t.PassExpiresAt):
				bad = append(bad, fmt.Sprintf("%s held at %s with a pass admitted %s, expiring %s", h.Token,
					h.CreatedAt.Format(time.StampMilli), t.AdmittedAt.Format(time.StampMilli), t.PassExpiresAt.Format(time.StampMilli)))
			}
		}
		if spent != len(lq.Holds) {
			bad = append(bad, fmt.Sprintf("%d passes spent for %d holds", spent, len(lq.Holds)))
		}
		add("no hold without a valid pass", len(bad) == 0, "%d holds in the ledger, each bought with its holder's pass, admitted before and unexpired at the hold%s",
			len(lq.Holds), sample(bad))
	}

	// One ticket per principal.
	var bad []string
	for _, c := range ev.Conflicts {
		bad = append(bad, "the API gave "+c)
	}
	if ev.RepeatSame != ev.RepeatJoins {
		bad = append(bad, fmt.Sprintf("%d of %d repeated joins answered another ticket", ev.RepeatJoins-ev.RepeatSame, ev.RepeatJoins))
	}
	detail := fmt.Sprintf("%d principals joined; %d of %d repeated joins answered the first ticket", len(ev.Numbers), ev.RepeatSame, ev.RepeatJoins)
	if lq != nil {
		seen, numbers := map[string]bool{}, map[int64]string{}
		for _, t := range lq.Tickets {
			if seen[t.Principal] {
				bad = append(bad, t.Principal+" has two tickets")
			}
			seen[t.Principal] = true
			if _, ok := ev.Bots[t.Principal]; !ok {
				bad = append(bad, t.Principal+" is not a principal of this run")
			}
			if t.Number > 0 {
				if o, dup := numbers[t.Number]; dup {
					bad = append(bad, fmt.Sprintf("number %d is %s's and %s's", t.Number, o, t.Principal))
				}
				numbers[t.Number] = t.Principal
			}
			if n, ok := ev.Numbers[t.Principal]; ok && n != 0 && n != t.Number {
				bad = append(bad, fmt.Sprintf("%s: the API said %d, the ledger %d", t.Principal, n, t.Number))
			}
		}
		for who := range ev.Numbers {
			if !seen[who] {
				bad = append(bad, who+" joined but has no ticket in the ledger")
			}
		}
		detail += fmt.Sprintf("; the ledger has %d tickets, %d numbered, each principal and number once", len(lq.Tickets), len(numbers))
	}
	add("at most one ticket per principal", len(bad) == 0, "%s%s", detail, sample(bad))

	// No unit oversold: the drop's checks on the queued SKU, then each hold
	// as Redis and the ledger have it.
	v := Judge(VerdictInput{Observed: Observed{Committed: ev.Committed, Unknown: ev.Unknown,
		Samples: append(slices.Clone(ev.Samples), StockSample{Stock: ev.API})}, API: ev.API, Ledger: ev.Ledger, Settled: ev.Settled})
	for _, c := range v.Checks {
		c.Name = "queue: " + c.Name
		checks = append(checks, c)
	}
	if lq == nil {
		skip("Redis and the ledger agree hold by hold")
	} else {
		bad = nil
		inLedger := map[string]bool{}
		for _, h := range lq.Holds {
			inLedger[h.Token] = true
			if who, ok := ev.Holds[h.Token]; !ok || who != h.Principal {
				bad = append(bad, fmt.Sprintf("%s (%s) was given to no principal of the run", h.Token, h.Principal))
			} else if st := ev.APIStatus[h.Token]; st != h.Status {
				bad = append(bad, fmt.Sprintf("%s: API %s, ledger %s", h.Token, st, h.Status))
			}
		}
		for tok := range ev.Holds {
			if !inLedger[tok] {
				bad = append(bad, tok+" is not in the ledger")
			}
		}
		add("Redis and the ledger agree hold by hold", len(bad) == 0, "%d holds given, %d in the ledger, each with the status the API reads from Redis%s",
			len(ev.Holds), len(lq.Holds), sample(bad))
	}

	// Every waiter told SOLD_OUT within a second of the last sale.
	var late []time.Duration
	never := 0
	for _, at := range ev.Told {
		if at.IsZero() {
			never++
			continue
		}
		late = append(late, at.Sub(ev.LastSale))
	}
	res.Watching, res.Told, res.SoldOutLate = len(ev.Told), len(late), quantiles(late)
	soldOut := ev.API.Total > 0 && ev.API.Sold == ev.API.Total
	add("every waiter told SOLD_OUT within 1 s of the last unit sold",
		soldOut && never == 0 && len(late) > 0 && res.SoldOutLate.MaxMs <= ms(soldOutCheckBound),
		"sold %d of %d; %d of %d websocket waiters told, from the last commit's answer p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d of %d polling waiters told at their next poll",
		ev.API.Sold, ev.API.Total, len(late), len(ev.Told), res.SoldOutLate.P50ms, res.SoldOutLate.P99ms, res.SoldOutLate.MaxMs,
		res.PollersTold, res.PollersWaiting)

	// The bots' share of the units.
	if lq == nil {
		skip("bots got no larger a share of the units than of the principals")
	} else {
		bots := 0
		for _, isBot := range ev.Bots {
			if isBot {
				bots++
			}
		}
		res.BotUnits, res.PeopleUnits = 0, 0
		for _, h := range lq.Holds {
			if h.Status != "COMMITTED" {
				continue
			}
			if ev.Bots[h.Principal] {
				res.BotUnits++
			} else {
				res.PeopleUnits++
			}
		}
		sold := res.BotUnits + res.PeopleUnits
		p := float64(bots) / float64(max(1, len(ev.Bots)))
		res.BotBound = binomialBound(sold, p)
		add("bots got no larger a share of the units than of the principals", float64(res.BotUnits) <= res.BotBound,
			"bots are %d of %d principals (%.1f %%) and bought %d of %d units (%.1f %%); at most %.1f allowed (n·p + 3·√(n·p·(1−p)), binomial at 3 sigma)",
			bots, len(ev.Bots), 100*p, res.BotUnits, sold, 100*float64(res.BotUnits)/float64(max(1, sold)), res.BotBound)
	}

	// Every abuse refused with its code.
	var parts []string
	bad = nil
	tried := 0
	for _, kind := range []string{AbuseNoProof, AbuseWrongProof, AbuseOthersProof, AbuseUsedCode, AbuseNoPass,
		AbuseForgedPass, AbuseOthersPass, AbuseSpentPass, AbuseExpiredPass} {
		codes := ev.Abuses[kind]
		if len(codes) == 0 {
			continue
		}
		var cs []string
		for _, code := range sortedCodes(codes) {
			tried += codes[code]
			cs = append(cs, fmt.Sprintf("%s %d", code, codes[code]))
			if code != abuseCode[kind] {
				bad = append(bad, fmt.Sprintf("%s: %s %d", kind, code, codes[code]))
			}
		}
		parts = append(parts, kind+": "+strings.Join(cs, ", "))
	}
	for kind := range ev.Abuses {
		if _, known := abuseCode[kind]; !known {
			bad = append(bad, "unknown abuse "+kind)
		}
	}
	res.Abuses, res.RepeatJoins, res.RepeatSame = ev.Abuses, ev.RepeatJoins, ev.RepeatSame
	add("every bot abuse refused with its typed code", len(bad) == 0 && tried > 0, "%d abuses; %s%s", tried, strings.Join(parts, "; "), sample(bad))
	return checks
}

// binomialBound is the most successes n draws of probability p give,
// within three standard deviations: n·p + 3·√(n·p·(1−p)). Units drawn from
// a fixed set of principals without replacement vary less than this
// (hypergeometric), so the bound is conservative.
func binomialBound(n int, p float64) float64 {
	mean := float64(n) * p
	return mean + 3*math.Sqrt(mean*(1-p))
}

// writeQueueText prints the queue rehearsal's figures.
func writeQueueText(b *strings.Builder, q *QueueResult) {
	fmt.Fprintf(b, "\nqueue rehearsal: SKU %s, %d units, %d servers; %d people (%d polling), %d bots x %d connections; proof of work %d bits, passes %d s, %d admitted/min, access codes %v\n",
		q.SKU, q.Stock, q.Servers, q.People, q.Pollers, q.Bots, q.BotConns, q.PowBits, q.PassSeconds, q.AdmitPerMinute, q.AccessCodes)
	fmt.Fprintf(b, "  joins: %d before the opening in %.2fs (ledger pre-queue %d), %d after; join p99 %.1f ms; %d tickets, admitted through %d\n",
		q.Early, q.EarlySeconds, q.PreQueue, q.Late, q.JoinP99ms, q.Tickets, q.AdmittedThrough)
	fmt.Fprintf(b, "  sold out %.2fs after the opening: people %d units, bots %d (bound %.1f); SOLD_OUT to %d of %d websocket waiters p50 %.0f ms, max %.0f ms after the last sale; load average %s\n",
		q.SellSeconds, q.PeopleUnits, q.BotUnits, q.BotBound, q.Told, q.Watching, q.SoldOutLate.P50ms, q.SoldOutLate.MaxMs, q.LoadAvg)
	for _, who := range []struct {
		name string
		m    map[string]int
	}{{"people", q.PeopleOutcomes}, {"bots", q.BotOutcomes}} {
		var parts []string
		for _, k := range sortedCodes(who.m) {
			parts = append(parts, fmt.Sprintf("%s %d", k, who.m[k]))
		}
		fmt.Fprintf(b, "  %-6s %s\n", who.name, strings.Join(parts, ", "))
	}
}
