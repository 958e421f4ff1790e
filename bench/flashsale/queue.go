package flashsale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dropline/dropline/internal/machine"
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
