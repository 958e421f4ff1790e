package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// Status is a queue's state as its waiters see it.
type Status string

// The statuses of a queue.
const (
	StatusPreQueue Status = "PRE_QUEUE" // before the opening (and while the pre-queue is numbered)
	StatusOpen     Status = "OPEN"      // admitting, as the rate and the stock allow
	StatusPaused   Status = "PAUSED"    // every unit is held: holds may come back
	StatusSoldOut  Status = "SOLD_OUT"  // every unit is sold
	StatusClosed   Status = "CLOSED"    // the sale window has ended
)

// TicketStatus is where one principal's ticket stands.
type TicketStatus string

// The statuses of a ticket.
const (
	TicketPreQueue TicketStatus = "PRE_QUEUE" // in the pre-queue, no number yet
	TicketWaiting  TicketStatus = "WAITING"
	TicketAdmitted TicketStatus = "ADMITTED" // holds an unspent, unexpired pass
	TicketUsed     TicketStatus = "USED"     // its pass bought a hold or a waitlist place
	TicketExpired  TicketStatus = "EXPIRED"  // its pass expired unspent
	TicketSoldOut  TicketStatus = "SOLD_OUT" // waiting, and every unit is sold
)

// Ticket is one principal's place in a queue.
type Ticket struct {
	Queue Ref
	// Number is the ticket's number, 0 in the pre-queue.
	Number int64
	// Position is how many tickets up to and including this one are still
	// to be admitted (Number - AdmittedThrough); 0 once admitted.
	Position        int64
	AdmittedThrough int64
	Status          TicketStatus
	QueueStatus     Status
	// Pass is the admission pass, once admitted; PassExpiresAt its expiry.
	Pass          string
	PassExpiresAt time.Time
	// Replayed says the principal had this ticket already.
	Replayed bool
}

// Config sets up a Service.
type Config struct {
	// Secret signs proof-of-work challenges (every instance must share it);
	// required when a queue asks for proof of work.
	Secret []byte
	// MaxTickets bounds the tickets of one queue; default 1,000,000.
	MaxTickets int
	// StepMost bounds the tickets one admission step admits, and the numbers
	// one numbering batch writes; default 1,000 (each script stays well
	// under 10 ms).
	StepMost int
	// ChallengeLife is how long a challenge may be answered; default 2 min.
	ChallengeLife time.Duration
	// Now is the clock for challenges; default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.MaxTickets == 0 {
		c.MaxTickets = 1_000_000
	}
	if c.StepMost == 0 {
		c.StepMost = 1000
	}
	if c.ChallengeLife == 0 {
		c.ChallengeLife = 2 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if len(c.Secret) == 0 {
		c.Secret = []byte(nonce())
	}
}

// Stock is what the queue needs of the engine: its keys, its ledger, and
// loading a SKU (with its drop) into Redis.
type Stock interface {
	Keys() inventory.Keys
	Ledger() *db.Ledger
	Rebuild(ctx context.Context, sku string) error
}

// Service runs admission queues: joins, tickets, challenges, and the
// admission step the worker group calls once per queue across instances.
type Service struct {
	cfg     Config
	rdb     redis.UniversalClient
	stock   Stock
	keys    inventory.Keys
	ledger  *db.Ledger
	scripts scripts

	mu       sync.Mutex
	settings map[string]db.Queue // by queue id: what never changes, read once
	reads    singleflight.Group  // one ledger read per queue at a time
	restores singleflight.Group  // one restore per queue at a time
	joins    joinBatcher         // joins of one queue go to Redis together

	// restored counts the tickets restores wrote, restoreTime their time
	// (RestoreStats).
	restored, restoreTime atomic.Int64
}

// RestoreStats are the tickets this service's restores wrote into Redis
// from the ledger, and the time they took.
func (s *Service) RestoreStats() (tickets int64, took time.Duration) {
	return s.restored.Load(), time.Duration(s.restoreTime.Load())
}

// New returns a Service over the engine's Redis and ledger.
func New(cfg Config, rdb redis.UniversalClient, stock Stock) *Service {
	cfg.setDefaults()
	s := &Service{cfg: cfg, rdb: rdb, stock: stock, keys: stock.Keys(), ledger: stock.Ledger(), scripts: newScripts(),
		settings: map[string]db.Queue{}}
	s.newJoinBatcher()
	if e, ok := stock.(queueRestorer); ok {
		e.RestoreQueuesWith(s.RestoreID)
	}
	return s
}

// queueRestorer is an engine that restores a queued SKU's queue (Restore)
// before the SKU goes live when it rebuilds it.
type queueRestorer interface {
	RestoreQueuesWith(fn func(ctx context.Context, queueID string) error)
}

var errUnavailable = inventory.ErrUnavailable

// Settings returns a queue's settings from the ledger (kept in memory:
// they never change, but for the seed, revealed at the opening);
// *inventory.NotFoundError when there is no such queue.
func (s *Service) Settings(ctx context.Context, r Ref) (db.Queue, error) {
	s.mu.Lock()
	q, ok := s.settings[r.String()]
	s.mu.Unlock()
	if ok && (q.Seed != nil || s.cfg.Now().Before(q.OpensAt)) {
		return q, nil
	}
	v, err, _ := s.reads.Do(r.String(), func() (any, error) { return s.ledger.Queues().Queue(ctx, r.String()) })
	q, _ = v.(db.Queue)
	if errors.Is(err, db.ErrNotFound) {
		return db.Queue{}, &inventory.NotFoundError{Kind: "queue", Key: r.String(), Field: string(r.Kind)}
	}
	if err != nil {
		return db.Queue{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	s.mu.Lock()
	s.settings[r.String()] = q
	s.mu.Unlock()
	return q, nil
}

// Challenge returns a proof-of-work challenge for principal and queue r;
// Bits is 0 (nothing to solve) when the queue asks for none.
func (s *Service) Challenge(ctx context.Context, principal string, r Ref) (Challenge, error) {
	q, err := s.Settings(ctx, r)
	if err != nil {
		return Challenge{}, err
	}
	exp := s.cfg.Now().Add(s.cfg.ChallengeLife)
	if q.ProofOfWorkBits == 0 {
		return Challenge{ExpiresAt: exp}, nil
	}
	return newChallenge(s.cfg.Secret, r, principal, q.ProofOfWorkBits, exp), nil
}

// JoinInput is what a join brings besides its principal.
type JoinInput struct {
	// Challenge and Proof answer the queue's proof of work, when it asks.
	Challenge, Proof string
	// AccessCode is a presale code, when the queue has them.
	AccessCode string
}

// Join gives principal its ticket of queue r, or its ticket again (one per
// principal per queue: a second join returns the first). A queue with proof
// of work refuses a join without a valid proof (inventory.ErrProofInvalid),
// one with access codes a join without an unused code or the principal's own
// (inventory.ErrAccessCodeInvalid); inventory.ErrQueueFull when the queue has
// MaxTickets.
func (s *Service) Join(ctx context.Context, principal string, r Ref, in JoinInput) (Ticket, error) {
	q, err := s.Settings(ctx, r)
	if err != nil {
		return Ticket{}, err
	}
	k := keysOf(s.keys, r)
	if q.ProofOfWorkBits > 0 || q.HasAccessCodes {
		// A principal with a ticket has it again, whatever it brings: its
		// ticket is read before its proof or its code is asked for. A queue
		// that asks neither goes straight to the script, which answers a
		// ticket given before just the same.
		if t, ok, err := s.ticket(ctx, k, r, principal); err != nil || ok {
			t.Replayed = true
			return t, err
		}
	}
	if q.ProofOfWorkBits > 0 && !verifyProof(s.cfg.Secret, r, principal, q.ProofOfWorkBits, in.Challenge, in.Proof, s.cfg.Now()) {
		return Ticket{}, inventory.ErrProofInvalid
	}
	if q.HasAccessCodes {
		ok, err := s.ledger.Queues().ClaimAccessCode(ctx, q.ID, in.AccessCode, principal)
		if err != nil {
			return Ticket{}, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		if !ok {
			return Ticket{}, inventory.ErrAccessCodeInvalid
		}
	}
	for loaded := false; ; loaded = true {
		rep, err := s.joinInBatch(ctx, k, principal)
		if err != nil {
			return Ticket{}, err
		}
		switch rep.Code {
		case "OK":
			return ticketOf(r, rep, s.cfg.Now()), nil
		case "QUEUE_FULL":
			return Ticket{}, inventory.ErrQueueFull
		case "INVALID_INPUT":
			return Ticket{}, &inventory.InvalidInputError{Field: "principal", Reason: "required"}
		case "NEEDS_LOAD":
			if loaded {
				return Ticket{}, fmt.Errorf("joining %s: still not loaded", r)
			}
			if err := s.Restore(ctx, r); err != nil {
				return Ticket{}, err
			}
		default:
			return Ticket{}, fmt.Errorf("joining %s: unexpected reply %q", r, rep.Code)
		}
	}
}

func ticketOf(r Ref, rep joinReply, now time.Time) Ticket {
	t := Ticket{Queue: r, Number: rep.Number, AdmittedThrough: rep.Through, QueueStatus: Status(rep.Status),
		Replayed: rep.Replayed}
	switch {
	case rep.Number == 0:
		t.Status = TicketPreQueue
	case rep.Number > rep.Through:
		t.Position = rep.Number - rep.Through
		t.Status = TicketWaiting
		if t.QueueStatus == StatusSoldOut {
			t.Status = TicketSoldOut
		}
	case rep.PassState == "U":
		t.Status = TicketUsed
	case rep.PassExpires <= now.UnixMilli():
		t.Status = TicketExpired
	default:
		t.Status, t.Pass = TicketAdmitted, rep.Pass
	}
	if rep.PassExpires > 0 {
		t.PassExpiresAt = time.UnixMilli(rep.PassExpires).UTC()
	}
	if t.QueueStatus == "" {
		t.QueueStatus = StatusPreQueue
	}
	return t
}

// MyTicket returns principal's ticket of queue r; ok is false when it has
// none.
func (s *Service) MyTicket(ctx context.Context, principal string, r Ref) (Ticket, bool, error) {
	if _, err := s.Settings(ctx, r); err != nil {
		return Ticket{}, false, err
	}
	return s.ticket(ctx, keysOf(s.keys, r), r, principal)
}

// ticket reads principal's ticket: three reads of one slot in one round
// trip. A queue Redis lost is restored from the ledger first.
func (s *Service) ticket(ctx context.Context, k keys, r Ref, principal string) (Ticket, bool, error) {
	var num, pass *redis.StringCmd
	var q *redis.SliceCmd
	for restored := false; ; restored = true {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			num = p.HGet(ctx, k.who, principal)
			pass = p.HGet(ctx, k.pass, principal)
			q = p.HMGet(ctx, k.queue, "through", "status")
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return Ticket{}, false, fmt.Errorf("reading a ticket of %s: %w: %w", r, errUnavailable, err)
		}
		if v := q.Val(); restored || (len(v) > 0 && v[0] != nil) {
			break
		}
		if err := s.Restore(ctx, r); err != nil {
			return Ticket{}, false, err
		}
	}
	n, err := num.Int64()
	if errors.Is(err, redis.Nil) {
		return Ticket{}, false, nil
	}
	rep := joinReply{Number: n}
	if v := q.Val(); len(v) == 2 {
		rep.Through = toInt(v[0])
		rep.Status, _ = v[1].(string)
	}
	if raw := pass.Val(); raw != "" {
		var parts [4]string
		copy(parts[:], strings.SplitN(raw, "|", 4))
		rep.Pass, rep.PassExpires, rep.PassState = parts[0], toInt(parts[1]), parts[2]
	}
	return ticketOf(r, rep, s.cfg.Now()), true, nil
}

func toInt(v any) int64 {
	var n int64
	if s, ok := v.(string); ok {
		_, _ = fmt.Sscan(s, &n)
	}
	return n
}

// StepResult is what one admission step did.
type StepResult struct {
	Status    Status
	Through   int64 // the last number admitted
	Next      int64 // the last number given
	Admitted  int   // admitted by this step
	Unspent   int   // passes neither spent nor expired
	Available int   // units available
	// Seq rises with every change a waiter can see.
	Seq int64
}

// Queues lists every queue, from the ledger, after the id given ("" from
// the start), at most limit.
func (s *Service) Queues(ctx context.Context, after string, limit int) ([]Ref, error) {
	ids, err := s.ledger.Queues().QueueIDs(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	out := make([]Ref, 0, len(ids))
	for _, id := range ids {
		if r, ok := ParseRef(id); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// Step runs one admission step of queue r: before the opening nothing; at
// the opening it numbers the pre-queue (in bounded batches, from the
// revealed seed); after, it admits the next tickets as admit_queue.lua
// allows. The worker group calls it for each queue, once across instances
// (a lease); a duplicate step admits nothing the rate and stock do not allow.
func (s *Service) Step(ctx context.Context, r Ref) (StepResult, error) {
	if _, err := s.Settings(ctx, r); err != nil {
		return StepResult{}, err
	}
	k := keysOf(s.keys, r)
	hydrated := map[string]bool{}
	for range 8 {
		rep, err := s.scripts.runAdmit(ctx, s.rdb, k, r, admitArgs{Nonce: nonce(), Most: s.cfg.StepMost})
		if err != nil {
			return StepResult{}, fmt.Errorf("admitting %s: %w", r, err)
		}
		switch rep.Code {
		case "OK", "PRE":
			return StepResult{Status: rep.Status, Through: rep.Through, Next: rep.Next, Admitted: rep.Admitted,
				Unspent: rep.Unspent, Available: rep.Available, Seq: rep.Seq}, nil
		case "NEEDS_LOAD":
			if err := s.Restore(ctx, r); err != nil {
				return StepResult{}, err
			}
		case "NUMBER":
			if err := s.numberPreQueue(ctx, k, r, rep.Pre); err != nil {
				return StepResult{}, err
			}
		case "NEEDS_HYDRATION":
			sku := rep.SKU
			if sku == "" && r.Kind == OfDrop {
				d, err := s.ledger.Drops().Drop(ctx, r.ID)
				if err != nil || len(d.SKUs) == 0 {
					return StepResult{Status: StatusPaused}, nil // a drop without SKUs has nothing to admit to
				}
				sku = d.SKUs[0]
			}
			if hydrated[sku] {
				return StepResult{}, fmt.Errorf("admitting %s: %s still not loaded", r, sku)
			}
			hydrated[sku] = true
			if err := s.stock.Rebuild(ctx, sku); err != nil {
				return StepResult{}, fmt.Errorf("admitting %s: %w", r, err)
			}
		default:
			return StepResult{}, fmt.Errorf("admitting %s: unexpected reply %q", r, rep.Code)
		}
	}
	return StepResult{}, fmt.Errorf("admitting %s: no answer after 8 tries", r)
}

// numberPreQueue gives the closed pre-queue's members their numbers, in
// PreQueueOrder from the queue's seed, in batches of StepMost.
func (s *Service) numberPreQueue(ctx context.Context, k keys, r Ref, pre int) error {
	s.mu.Lock()
	delete(s.settings, r.String()) // the seed is revealed now
	s.mu.Unlock()
	q, err := s.Settings(ctx, r)
	if err != nil {
		return err
	}
	if q.Seed == nil {
		return fmt.Errorf("numbering %s: the ledger has not revealed the seed yet", r)
	}
	members, err := s.preQueue(ctx, k)
	if err != nil {
		return fmt.Errorf("numbering %s: %w", r, err)
	}
	if len(members) != pre {
		return fmt.Errorf("numbering %s: the pre-queue has %d members, the queue says %d", r, len(members), pre)
	}
	order := PreQueueOrder(q.Seed, members)
	for i := 0; i < len(order); i += s.cfg.StepMost {
		rep, err := s.scripts.runNumber(ctx, s.rdb, k, numberArgs{First: i + 1, Principals: order[i:min(i+s.cfg.StepMost, len(order))]})
		if err != nil {
			return fmt.Errorf("numbering %s: %w", r, err)
		}
		if rep.Code == "NOT_NUMBERING" {
			return nil // another step numbered it
		}
		if rep.Code != "OK" {
			return fmt.Errorf("numbering %s: unexpected reply %q", r, rep.Code)
		}
	}
	return nil
}

// preQueue reads a closed pre-queue's members, in bounded SSCAN steps.
func (s *Service) preQueue(ctx context.Context, k keys) ([]string, error) {
	var out []string
	var cursor uint64
	for {
		batch, next, err := s.rdb.SScan(ctx, k.pre, cursor, "", int64(s.cfg.StepMost)).Result()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		out = append(out, batch...)
		if cursor = next; cursor == 0 {
			break
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// PreQueueOrder is the order a pre-queue is numbered in, as anyone can
// recompute it once the seed is revealed (dropline verify-queue): the
// members sorted, then shuffled with the draw's shuffle (inventory.DrawOrder)
// from the seed. The i-th principal returned gets number i+1.
func PreQueueOrder(seed []byte, members []string) []string {
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	order := inventory.DrawOrder(seed, len(sorted))
	out := make([]string, len(sorted))
	for p, i := range order {
		out[p] = sorted[i]
	}
	return out
}

func nonce() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// State is a queue as every waiter sees it.
type State struct {
	Ref             Ref
	Status          Status
	OpensAt         time.Time
	AdmittedThrough int64
	// Waiting is the tickets given and not admitted yet.
	Waiting        int64
	AdmitPerMinute int
	SeedHash       string
	// Seed is nil until the opening.
	Seed []byte
	// Seq rises with every change a waiter can see (the queue's
	// announcements carry it), so a reader can tell the newer of two states.
	Seq int64
}

// State returns queue r's state: its settings from memory, its counters
// from Redis in one read.
func (s *Service) State(ctx context.Context, r Ref) (State, error) {
	q, err := s.Settings(ctx, r)
	if err != nil {
		return State{}, err
	}
	st := State{Ref: r, Status: StatusPreQueue, OpensAt: q.OpensAt.UTC(), AdmitPerMinute: q.AdmitPerMinute,
		SeedHash: q.SeedHash, Seed: q.Seed}
	v, err := s.rdb.HMGet(ctx, keysOf(s.keys, r).queue, "through", "next", "status", "state", "seq").Result()
	if err != nil {
		return State{}, fmt.Errorf("reading queue %s: %w: %w", r, errUnavailable, err)
	}
	if v[0] != nil {
		st.Seq = toInt(v[4])
		st.AdmittedThrough = toInt(v[0])
		st.Waiting = toInt(v[1]) - st.AdmittedThrough
		if v[3] == "open" {
			st.Status = Status(v[2].(string))
		} else {
			st.Waiting = 0
		}
	}
	if st.Status == StatusPreQueue && st.Waiting == 0 {
		// The pre-queue's members wait too, without numbers.
		n, err := s.rdb.SCard(ctx, keysOf(s.keys, r).pre).Result()
		if err == nil && v[0] != nil && v[3] == "pre" {
			st.Waiting = n
		}
	}
	return st, nil
}
