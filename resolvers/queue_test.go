package resolvers_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/inventory/queue"
)

const ticketFields = `ticket { number position status pass passExpiresAt pollAfterSeconds queue { id status admittedThrough waiting seedHash } } ` + userErrorFields

type ticketPayload struct {
	Ticket *struct {
		Number, Position *int
		Status           string
		Pass             *string
		PollAfterSeconds int
		Queue            struct {
			ID, Status               string
			AdmittedThrough, Waiting int
			SeedHash                 string
		}
	}
	UserErrors []struct {
		Code    string
		Field   []string
		Message string
	}
}

// TestQueueOverGraphQL: a drop behind a queue with proof of work, from its
// creation to a hold bought with the pass; each refusal a userError with
// its code.
func TestQueueOverGraphQL(t *testing.T) {
	t.Parallel()
	e := graphqltest.Setup(t)
	admin, alice, bob := e.Token(t, "admin", true), e.Token(t, "alice", false), e.Token(t, "bob", false)

	var made struct{ CreateDrop dropPayload }
	e.MustDo(t, admin, dropDoc, map[string]any{"i": map[string]any{"id": "QD", "name": "Queued drop", "maxPerUser": 1,
		"queue": map[string]any{"opensAt": time.Now().Add(-time.Second).Format(time.RFC3339Nano), "admitPerMinute": 60000,
			"proofOfWorkBits": 8}}}, &made)
	require.Empty(t, made.CreateDrop.UserErrors)
	e.CreateProduct(t, map[string]any{"sku": "QD-42", "stock": 1, "drop": "QD"})

	var q struct {
		Product struct {
			Queue *struct{ ID, Status, SeedHash string }
		}
		Plain *struct{ DropID string } `json:"drop"`
	}
	e.MustDo(t, "", `{ product(sku: "QD-42") { queue { id status seedHash } } drop(id: "QD") { dropId } }`, nil, &q)
	require.NotNil(t, q.Product.Queue, "a SKU of a queued drop shows its drop's queue")
	require.Equal(t, "drop:QD", q.Product.Queue.ID)
	require.Len(t, q.Product.Queue.SeedHash, 64)

	joinDoc := `mutation($i: JoinQueueInput!) { joinQueue(input: $i) { ` + ticketFields + ` } }`
	var noProof struct{ JoinQueue ticketPayload }
	e.MustDo(t, alice, joinDoc, map[string]any{"i": map[string]any{"drop": "QD"}}, &noProof)
	require.Equal(t, "PROOF_INVALID", noProof.JoinQueue.UserErrors[0].Code)

	var ch struct {
		QueueChallenge struct {
			Challenge string
			Bits      int
		}
	}
	e.MustDo(t, alice, `{ queueChallenge(drop: "QD") { challenge bits expiresAt } }`, nil, &ch)
	require.Equal(t, 8, ch.QueueChallenge.Bits)
	proof := queue.Solve(queue.Challenge{Challenge: ch.QueueChallenge.Challenge, Bits: ch.QueueChallenge.Bits})
	var joined struct{ JoinQueue ticketPayload }
	e.MustDo(t, alice, joinDoc, map[string]any{"i": map[string]any{"drop": "QD", "challenge": ch.QueueChallenge.Challenge, "proof": proof}}, &joined)
	require.Empty(t, joined.JoinQueue.UserErrors)
	require.Equal(t, 1, *joined.JoinQueue.Ticket.Number)
	require.Equal(t, "WAITING", joined.JoinQueue.Ticket.Status)

	var stolen struct{ JoinQueue ticketPayload }
	e.MustDo(t, bob, joinDoc, map[string]any{"i": map[string]any{"drop": "QD", "challenge": ch.QueueChallenge.Challenge, "proof": proof}}, &stolen)
	require.Equal(t, "PROOF_INVALID", stolen.JoinQueue.UserErrors[0].Code, "a challenge is its principal's")

	reserve := func(authz string, pass any) struct{ Reserve payload } {
		var out struct{ Reserve payload }
		e.MustDo(t, authz, reserveDoc, map[string]any{"i": map[string]any{"sku": "QD-42", "quantity": 1, "admissionPass": pass}}, &out)
		return out
	}
	only(t, reserve(alice, nil).Reserve, "QUEUE_REQUIRED")

	time.Sleep(10 * time.Millisecond)
	_, err := queue.New(queue.Config{}, e.Redis, e.Engine).Step(t.Context(), queue.Ref{Kind: queue.OfDrop, ID: "QD"})
	require.NoError(t, err)
	var mine struct {
		MyQueueTicket *struct {
			Status string
			Pass   *string
		}
	}
	e.MustDo(t, alice, `{ myQueueTicket(drop: "QD") { status pass } }`, nil, &mine)
	require.Equal(t, "ADMITTED", mine.MyQueueTicket.Status)
	only(t, reserve(bob, *mine.MyQueueTicket.Pass).Reserve, "PASS_INVALID")
	got := reserve(alice, *mine.MyQueueTicket.Pass)
	require.Empty(t, got.Reserve.UserErrors)
	require.NotNil(t, got.Reserve.Reservation)
	e.MustDo(t, alice, `{ myQueueTicket(drop: "QD") { status pass } }`, nil, &mine)
	require.Equal(t, "USED", mine.MyQueueTicket.Status)
}
