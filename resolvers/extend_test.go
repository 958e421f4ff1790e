package resolvers_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/internal/testenv"
)

func TestExtendReservation(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			extendReservation(t, graphqltest.SetupOn(t, backend))
		})
	}
}

func extendReservation(t *testing.T, e *graphqltest.Env) {
	e.CreateProduct(t, map[string]any{"sku": "PAY", "stock": 3})
	alice, bob := e.Token(t, "alice", false), e.Token(t, "bob", false)
	held := e.Reserve(t, alice, map[string]any{"sku": "PAY", "quantity": 1, "holdSeconds": 60})
	require.Empty(t, held.UserErrors)
	token := held.Reservation.Token
	require.Zero(t, held.Reservation.Extensions)

	only(t, e.Extend(t, bob, token, 300), "FORBIDDEN")
	for _, secs := range []int{0, -5, 3601} {
		ue := only(t, e.Extend(t, alice, token, secs), "INVALID_INPUT")
		require.Equal(t, []string{"input", "holdSeconds"}, ue.Field)
	}
	only(t, e.Extend(t, "", token, 300), "UNAUTHENTICATED")
	only(t, e.Extend(t, alice, "r01.unknown", 300), "INVALID_INPUT")

	keyed := func(secs int, key string) graphqltest.Payload {
		var out struct{ ExtendReservation graphqltest.Payload }
		e.MustDo(t, alice, graphqltest.ExtendDoc, map[string]any{"i": map[string]any{"token": token, "holdSeconds": secs, "idempotencyKey": key}}, &out)
		return out.ExtendReservation
	}
	x := keyed(300, "pay-1")
	require.Empty(t, x.UserErrors)
	require.Equal(t, "HELD", x.Reservation.Status)
	require.Equal(t, 1, x.Reservation.Extensions)
	require.WithinDuration(t, time.Now().Add(300*time.Second), x.Reservation.ExpiresAt, 5*time.Second)
	require.Equal(t, 1, x.Reservation.Product.Stock.Held, "an extension moves no stock")
	// The client's retry of that call (its answer timed out) burns no extension.
	retry := keyed(300, "pay-1")
	require.Empty(t, retry.UserErrors)
	require.Equal(t, 1, retry.Reservation.Extensions)
	require.Equal(t, x.Reservation.ExpiresAt, retry.Reservation.ExpiresAt)
	only(t, keyed(600, "pay-1"), "IDEMPOTENCY_KEY_REUSED")

	// Past the longest hold (3600 s) after creation, and past the count.
	ue := only(t, e.Extend(t, alice, token, 3600), "EXTENSION_LIMIT")
	require.Equal(t, []string{"input", "holdSeconds"}, ue.Field)
	require.Contains(t, ue.Message, "cannot be held past")
	require.Empty(t, e.Extend(t, alice, token, 900).UserErrors)
	ue = only(t, e.Extend(t, alice, token, 900), "EXTENSION_LIMIT")
	require.Equal(t, "the reservation was extended 2 times, the most allowed", ue.Message)

	var q struct{ Reservation *reservation }
	e.MustDo(t, alice, `query($t: ID!) { reservation(token: $t) { `+reservationFields+` } }`, map[string]any{"t": token}, &q)
	require.Equal(t, 2, q.Reservation.Extensions)
	require.WithinDuration(t, time.Now().Add(900*time.Second), q.Reservation.ExpiresAt, 5*time.Second)

	require.Empty(t, e.Commit(t, alice, token).UserErrors)
	only(t, e.Extend(t, alice, token, 60), "ALREADY_COMMITTED")
}

func TestExtendAfterExpiryIsExpired(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "SLOW-PAY", "stock": 1})
	alice := e.Token(t, "alice", false)
	held := e.Reserve(t, alice, map[string]any{"sku": "SLOW-PAY", "quantity": 1, "holdSeconds": 1})
	require.Empty(t, held.UserErrors)
	expiresAt := held.Reservation.ExpiresAt
	require.Eventually(t, func() bool { return time.Now().After(expiresAt.Add(10 * time.Millisecond)) }, 5*time.Second, 10*time.Millisecond)
	only(t, e.Extend(t, alice, held.Reservation.Token, 600), "EXPIRED")
	var q struct{ Reservation *reservation }
	e.MustDo(t, alice, `query($t: ID!) { reservation(token: $t) { `+reservationFields+` } }`, map[string]any{"t": held.Reservation.Token}, &q)
	require.Equal(t, expiresAt, q.Reservation.ExpiresAt, "nothing changed")
	require.Zero(t, q.Reservation.Extensions)
}
