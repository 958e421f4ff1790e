package flashsale

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dropline/dropline/inventory/queue"
)

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
