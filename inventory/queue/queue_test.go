package queue_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var admin = inventory.Principal{ID: "admin", Admin: true}

type bundle struct {
	ctx    context.Context
	engine *inventory.Engine
	queues *queue.Service
	rdb    redis.UniversalClient
	pool   *pgxpool.Pool
	prefix string
}

func setup(t testing.TB, backend string) *bundle { return setupWith(t, backend, inventory.Config{}) }

func setupWith(t testing.TB, backend string, cfg inventory.Config) *bundle {
	t.Helper()
	r := testenv.RedisBackend(t, backend)
	pool := testenv.Postgres(t)
	ctx := context.Background()
	cfg.KeyPrefix = r.Prefix
	e, err := inventory.NewEngine(ctx, cfg, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	qs := queue.New(queue.Config{Secret: []byte("a test secret of thirty-two bytes!")}, r.Client, e)
	return &bundle{ctx: ctx, engine: e, queues: qs, rdb: r.Client, pool: pool, prefix: r.Prefix}
}

func (b *bundle) queuedProduct(t testing.TB, sku string, stock int, q inventory.QueueSettings) queue.Ref {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: "Product " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: stock, Queue: &q,
	})
	require.NoError(t, err)
	return queue.Ref{Kind: queue.OfProduct, ID: sku}
}

// step runs one admission step, as the worker group's ticker does.
func (b *bundle) step(t testing.TB, r queue.Ref) queue.StepResult {
	t.Helper()
	res, err := b.queues.Step(b.ctx, r)
	require.NoError(t, err)
	return res
}

func buyer(i int) inventory.Principal { return inventory.Principal{ID: fmt.Sprintf("buyer-%d", i)} }

func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

// TestAdmissionFollowsTheStock walks one queued product through its life:
// no hold without a pass, passes only for the units there are, in ticket
// order; PAUSED while every unit is held, OPEN again when one comes back,
// SOLD_OUT once every unit is sold.
func TestAdmissionFollowsTheStock(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		r := b.queuedProduct(t, "Q-TEE", 3, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 600_000})

		_, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrQueueRequired)
		require.Equal(t, inventory.ErrQueueRequired.Code(), inventory.ErrorCode(err))

		for i := 1; i <= 6; i++ {
			tk, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
			require.Equal(t, int64(i), tk.Number, "after the opening, first come, first numbered")
			require.Equal(t, queue.TicketWaiting, tk.Status)
		}
		again, err := b.queues.Join(b.ctx, buyer(2).ID, r, queue.JoinInput{})
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, int64(2), again.Number, "joining again returns the ticket")

		time.Sleep(20 * time.Millisecond) // some credit: 10 admissions a millisecond
		res := b.step(t, r)
		require.Equal(t, queue.StatusOpen, res.Status)
		require.Equal(t, int64(3), res.Through, "three units, three passes")
		require.Equal(t, 3, res.Unspent)

		ticket := func(i int) queue.Ticket {
			tk, ok, err := b.queues.MyTicket(b.ctx, buyer(i).ID, r)
			require.NoError(t, err)
			require.True(t, ok)
			return tk
		}
		for i := 1; i <= 3; i++ {
			require.Equal(t, queue.TicketAdmitted, ticket(i).Status)
		}
		require.Equal(t, queue.TicketWaiting, ticket(4).Status)
		require.Equal(t, int64(1), ticket(4).Position)

		// Another's pass, a forged one, none: refused with their codes.
		_, err = b.engine.Reserve(b.ctx, buyer(4), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1, AdmissionPass: ticket(1).Pass})
		require.ErrorIs(t, err, inventory.ErrPassInvalid)
		_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1, AdmissionPass: "forged"})
		require.ErrorIs(t, err, inventory.ErrPassInvalid)

		var holds []inventory.Reservation
		for i := 1; i <= 3; i++ {
			h, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1, AdmissionPass: ticket(i).Pass})
			require.NoError(t, err)
			holds = append(holds, h)
			require.Equal(t, queue.TicketUsed, ticket(i).Status, "the hold spends the pass")
		}
		pass1 := ticket(1).Pass
		require.Empty(t, pass1)
		_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1, AdmissionPass: ticket(1).Pass})
		require.ErrorIs(t, err, inventory.ErrQueueRequired)

		time.Sleep(20 * time.Millisecond)
		res = b.step(t, r)
		require.Equal(t, queue.StatusPaused, res.Status, "every unit held")
		require.Equal(t, int64(3), res.Through)

		_, err = b.engine.Cancel(b.ctx, buyer(1), holds[0].Token)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		res = b.step(t, r)
		require.Equal(t, queue.StatusOpen, res.Status, "a unit came back")
		require.Equal(t, int64(4), res.Through, "one unit, one more pass, to the next number")
		require.Equal(t, queue.TicketAdmitted, ticket(4).Status)

		for i, h := range holds[1:] {
			_, err := b.engine.Commit(b.ctx, buyer(i+2), h.Token)
			require.NoError(t, err)
		}
		h, err := b.engine.Reserve(b.ctx, buyer(4), inventory.ReserveRequest{SKU: "Q-TEE", Quantity: 1, AdmissionPass: ticket(4).Pass})
		require.NoError(t, err)
		_, err = b.engine.Commit(b.ctx, buyer(4), h.Token)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		res = b.step(t, r)
		require.Equal(t, queue.StatusSoldOut, res.Status)
		require.Equal(t, int64(4), res.Through)
		require.Equal(t, queue.TicketSoldOut, ticket(5).Status)
	})
}

// TestPreQueueIsShuffledAsAnyoneRecomputes: the joins before the opening
// get their numbers from the seed, exactly as PreQueueOrder recomputes them
// from the revealed seed and the members; later joins come after.
func TestPreQueueIsShuffledAsAnyoneRecomputes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		r := b.queuedProduct(t, "Q-PRE", 10, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 60})
		const n = 2500
		var wg sync.WaitGroup
		errs := make([]error, n)
		numbers := make([]int64, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
				if err == nil && (tk.Number == 0) != (tk.Status == queue.TicketPreQueue) {
					err = fmt.Errorf("ticket %+v", tk)
				}
				numbers[i], errs[i] = tk.Number, err
			}()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		var members []string
		for i, num := range numbers {
			require.Zero(t, num)
			members = append(members, buyer(i).ID)
		}
		pre := len(members)
		st, err := b.queues.Settings(b.ctx, r)
		require.NoError(t, err)
		require.Nil(t, st.Seed, "the seed stays secret until the opening")
		require.Len(t, st.SeedHash, 64)

		// The opening comes: the ledger and Redis are told it is now (the
		// scripts read Redis' clock, which a test cannot move).
		_, err = b.pool.Exec(b.ctx, `UPDATE queues SET opens_at = now() WHERE id = $1`, r.String())
		require.NoError(t, err)
		base := b.engine.Keys().Base(inventory.PartitionOf(r.ID))
		require.NoError(t, b.rdb.HSet(b.ctx, base+"q:"+r.String(), "opens", time.Now().Add(-time.Second).UnixMilli()).Err())
		res := b.step(t, r)
		require.Equal(t, int64(n), res.Next)
		late, err := b.queues.Join(b.ctx, "late", r, queue.JoinInput{})
		require.NoError(t, err)
		require.Equal(t, int64(n+1), late.Number)
		for i, num := range numbers {
			require.True(t, num == 0 || num > int64(pre), "%s joined after the opening and got %d", buyer(i).ID, num)
		}

		st, err = b.queues.Settings(b.ctx, r)
		require.NoError(t, err)
		require.Equal(t, st.SeedHash, sha256Hex(st.Seed), "the seed revealed is the one committed to")
		want := queue.PreQueueOrder(st.Seed, members)
		for i, who := range want {
			tk, ok, err := b.queues.MyTicket(b.ctx, who, r)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(i+1), tk.Number, "%s", who)
		}
		require.NotEqual(t, members[:10], want[:10], "shuffled")
		v, err := b.queues.VerifyPreQueue(b.ctx, r)
		require.NoError(t, err)
		require.Equal(t, pre, v.PreQueue)
		// Two numbers swapped: the verifier says so.
		num := base + "qnum:" + r.String()
		require.NoError(t, b.rdb.HSet(b.ctx, num, "1", want[1], "2", want[0]).Err())
		_, err = b.queues.VerifyPreQueue(b.ctx, r)
		require.ErrorIs(t, err, queue.ErrNotVerified)
		t.Logf("%d pre-queue tickets numbered as recomputed", pre)
	})
}

// TestOneTicketPerPrincipal: thousands of concurrent joins, each principal
// twice, give each principal one number and every number one principal.
func TestOneTicketPerPrincipal(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		r := b.queuedProduct(t, "Q-ONE", 10, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 60})
		const people = 1500
		var wg sync.WaitGroup
		got := make([]int64, 2*people)
		errs := make([]error, 2*people)
		for i := range 2 * people {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, err := b.queues.Join(b.ctx, buyer(i%people).ID, r, queue.JoinInput{})
				got[i], errs[i] = tk.Number, err
			}()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		seen := map[int64]bool{}
		for i := range people {
			require.Equal(t, got[i], got[i+people], "%s joined twice, one ticket", buyer(i).ID)
			require.False(t, seen[got[i]], "number %d given twice", got[i])
			seen[got[i]] = true
		}
		for n := int64(1); n <= people; n++ {
			require.True(t, seen[n], "number %d missing", n)
		}
	})
}

// TestProofOfWork: a queue with proof of work refuses a join without one,
// with another's, or with too few bits, and takes a solved challenge.
func TestProofOfWork(t *testing.T) {
	t.Parallel()
	b := setup(t, "single")
	r := b.queuedProduct(t, "Q-POW", 10, inventory.QueueSettings{OpensAt: time.Now(), AdmitPerMinute: 60, ProofOfWorkBits: 12})
	_, err := b.queues.Join(b.ctx, "alice", r, queue.JoinInput{})
	require.ErrorIs(t, err, inventory.ErrProofInvalid)
	c, err := b.queues.Challenge(b.ctx, "alice", r)
	require.NoError(t, err)
	require.Equal(t, 12, c.Bits)
	proof := queue.Solve(c)
	_, err = b.queues.Join(b.ctx, "mallory", r, queue.JoinInput{Challenge: c.Challenge, Proof: proof})
	require.ErrorIs(t, err, inventory.ErrProofInvalid, "a challenge is bound to its principal")
	bad := "x"
	for queue.LeadingZeroBits(c.Challenge, bad) >= 12 {
		bad += "x"
	}
	_, err = b.queues.Join(b.ctx, "alice", r, queue.JoinInput{Challenge: c.Challenge, Proof: bad})
	require.ErrorIs(t, err, inventory.ErrProofInvalid)
	tk, err := b.queues.Join(b.ctx, "alice", r, queue.JoinInput{Challenge: c.Challenge, Proof: proof})
	require.NoError(t, err)
	require.Equal(t, int64(1), tk.Number)
}

// TestAccessCodes: each code is used by one principal.
func TestAccessCodes(t *testing.T) {
	t.Parallel()
	b := setup(t, "single")
	r := b.queuedProduct(t, "Q-CODE", 10, inventory.QueueSettings{OpensAt: time.Now(), AdmitPerMinute: 60,
		AccessCodes: []string{"VIP-1", "VIP-2"}})
	_, err := b.queues.Join(b.ctx, "alice", r, queue.JoinInput{})
	require.ErrorIs(t, err, inventory.ErrAccessCodeInvalid)
	_, err = b.queues.Join(b.ctx, "alice", r, queue.JoinInput{AccessCode: "VIP-1"})
	require.NoError(t, err)
	_, err = b.queues.Join(b.ctx, "bob", r, queue.JoinInput{AccessCode: "VIP-1"})
	require.ErrorIs(t, err, inventory.ErrAccessCodeInvalid, "a code is one principal's")
	_, err = b.queues.Join(b.ctx, "bob", r, queue.JoinInput{AccessCode: "VIP-2"})
	require.NoError(t, err)
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestCartsAndWaitlistAskForThePass: a cart line and a waitlist join of a
// queued product are held to the pass like a reserve, and spend it.
func TestCartsAndWaitlistAskForThePass(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		r := b.queuedProduct(t, "Q-CART", 2, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 600_000})
		b.product(t, "PLAIN", 5)
		for i := 1; i <= 3; i++ {
			_, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
		}
		time.Sleep(20 * time.Millisecond)
		require.Equal(t, int64(2), b.step(t, r).Through)
		pass := func(i int) string {
			tk, _, err := b.queues.MyTicket(b.ctx, buyer(i).ID, r)
			require.NoError(t, err)
			return tk.Pass
		}
		lines := []inventory.CartLine{{SKU: "Q-CART", Quantity: 1}, {SKU: "PLAIN", Quantity: 1}}
		_, err := b.engine.Carts().ReserveCart(b.ctx, buyer(3), inventory.CartRequest{Lines: lines})
		require.ErrorIs(t, err, inventory.ErrQueueRequired, "a cart line needs the pass")
		_, err = b.engine.Carts().ReserveCart(b.ctx, buyer(3), inventory.CartRequest{Lines: lines, AdmissionPass: pass(1)})
		require.ErrorIs(t, err, inventory.ErrPassInvalid, "another's pass")
		cart, err := b.engine.Carts().ReserveCart(b.ctx, buyer(1), inventory.CartRequest{Lines: lines, AdmissionPass: pass(1)})
		require.NoError(t, err)
		require.Len(t, cart.Lines, 2)
		_, err = b.engine.Carts().ReserveCart(b.ctx, buyer(1), inventory.CartRequest{Lines: lines[:1], AdmissionPass: "spent"})
		require.ErrorIs(t, err, inventory.ErrPassInvalid)

		_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, buyer(3), inventory.JoinWaitlistRequest{SKU: "Q-CART", Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrQueueRequired, "a waitlist join needs the pass")
		w, err := b.engine.Waitlists().JoinWaitlist(b.ctx, buyer(2), inventory.JoinWaitlistRequest{SKU: "Q-CART", Quantity: 1, AdmissionPass: pass(2)})
		require.NoError(t, err)
		require.Equal(t, inventory.WaitOffered, w.Status, "a unit is there: served at once")
		tk, _, err := b.queues.MyTicket(b.ctx, buyer(2).ID, r)
		require.NoError(t, err)
		require.Equal(t, queue.TicketUsed, tk.Status, "the join spent the pass")
		s, err := b.engine.Catalog().Stock(b.ctx, "Q-CART")
		require.NoError(t, err)
		require.Equal(t, 0, s.Available)
		require.Equal(t, 2, s.Held)
	})
}

func (b *bundle) product(t testing.TB, sku string, stock int) {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: "Product " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: stock,
	})
	require.NoError(t, err)
}
