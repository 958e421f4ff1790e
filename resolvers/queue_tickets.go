package resolvers

import (
	"sync"

	"github.com/dropline/dropline/inventory/queue"
)

// ticketNumbers remembers the ticket numbers of the principals this process
// saw join or look their ticket up, so that myQueueTicket, which clients
// poll, is answered from memory: a waiting ticket's position is its number
// minus the queue's admittedThrough, which the live hub keeps (QueueState).
// A ticket's number never changes once given (0, the pre-queue, is not
// remembered as final: the opening numbers it). Bounded: past
// maxTicketNumbers entries the memory is dropped and rebuilt from lookups.
type ticketNumbers struct {
	mu sync.RWMutex
	m  map[ticketKey]int64
}

type ticketKey struct {
	queue     queue.Ref
	principal string
}

// maxTicketNumbers bounds the entries (about 100 bytes each).
const maxTicketNumbers = 1 << 20

func newTicketNumbers() *ticketNumbers { return &ticketNumbers{m: map[ticketKey]int64{}} }

func (c *ticketNumbers) get(r queue.Ref, principal string) (int64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.m[ticketKey{r, principal}]
	return n, ok
}

func (c *ticketNumbers) put(r queue.Ref, principal string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxTicketNumbers {
		clear(c.m)
	}
	c.m[ticketKey{r, principal}] = n
}

// waitingTicket is principal's ticket number n read against the queue's
// state st, when that needs nothing else: waiting (or told the queue is sold
// out), or in the pre-queue before the opening's step. ok is false once the
// ticket is admitted (its pass is in Redis) or numbered since.
func waitingTicket(r queue.Ref, n int64, st queue.State) (queue.Ticket, bool) {
	t := queue.Ticket{Queue: r, Number: n, AdmittedThrough: st.AdmittedThrough, QueueStatus: st.Status, Replayed: true}
	switch {
	case n == 0 && st.Status == queue.StatusPreQueue:
		t.Status = queue.TicketPreQueue
	case n > 0 && n > st.AdmittedThrough:
		t.Position = n - st.AdmittedThrough
		t.Status = queue.TicketWaiting
		if st.Status == queue.StatusSoldOut {
			t.Status = queue.TicketSoldOut
		}
	default:
		return queue.Ticket{}, false
	}
	return t, true
}
