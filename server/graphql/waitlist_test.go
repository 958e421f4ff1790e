package graphql_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
)

const (
	waitlistFields = `sku quantity position status holdSeconds joinedAt reservation { token status quantity expiresAt }`
	joinDoc        = `mutation($i: JoinWaitlistInput!) { joinWaitlist(input: $i) { entry { ` + waitlistFields + ` } ` + userErrorFields + ` } }`
	leaveDoc       = `mutation($i: LeaveWaitlistInput!) { leaveWaitlist(input: $i) { entry { ` + waitlistFields + ` } ` + userErrorFields + ` } }`
	myWaitlistDoc  = `{ myWaitlist { ` + waitlistFields + ` } }`
	waitlistSub    = `subscription($s: ID!) { waitlistChanged(sku: $s) { ` + waitlistFields + ` } }`
)

type waitEntry struct {
	Sku         string
	Quantity    int
	Position    *int
	Status      string
	HoldSeconds int
	JoinedAt    *time.Time
	Reservation *struct {
		Token, Status string
		Quantity      int
		ExpiresAt     time.Time
	}
}

type waitPayload struct {
	Entry      *waitEntry
	UserErrors []struct{ Code, Message string }
}

func TestWaitlistOverGraphQL(t *testing.T) {
	t.Parallel()
	le := setupLive(t, live.HubConfig{})
	e := le.env
	e.CreateProduct(t, map[string]any{"sku": "WL-GQL", "stock": 1})
	holder := e.Token(t, "holder", false)
	r := e.Reserve(t, holder, map[string]any{"sku": "WL-GQL", "quantity": 1})
	require.Empty(t, r.UserErrors)

	join := func(authz string, in map[string]any) waitPayload {
		var out struct{ JoinWaitlist waitPayload }
		e.MustDo(t, authz, joinDoc, map[string]any{"i": in}, &out)
		return out.JoinWaitlist
	}
	first, second := e.Token(t, "first", false), e.Token(t, "second", false)
	p := join(first, map[string]any{"sku": "WL-GQL", "quantity": 1, "holdSeconds": 120})
	require.Empty(t, p.UserErrors)
	require.Equal(t, "WAITING", p.Entry.Status)
	require.Equal(t, 1, *p.Entry.Position)
	require.Equal(t, 120, p.Entry.HoldSeconds)
	p = join(second, map[string]any{"sku": "WL-GQL", "quantity": 1, "holdSeconds": 300})
	require.Equal(t, 2, *p.Entry.Position)
	again := join(second, map[string]any{"sku": "WL-GQL", "quantity": 1})
	require.Equal(t, p.Entry, again.Entry, "joining twice returns the entry")

	bad := join(second, map[string]any{"sku": "WL-GQL", "quantity": 0})
	require.Len(t, bad.UserErrors, 1)
	require.Equal(t, "INVALID_INPUT", bad.UserErrors[0].Code)
	unknown := join(second, map[string]any{"sku": "NO-SUCH", "quantity": 1})
	require.Equal(t, "NOT_FOUND", unknown.UserErrors[0].Code)
	anonymous := join("", map[string]any{"sku": "WL-GQL", "quantity": 1})
	require.Equal(t, "UNAUTHENTICATED", anonymous.UserErrors[0].Code)

	c := le.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": second}})
	s := subscribe(t, c, waitlistSub, map[string]any{"s": "WL-GQL"})
	read := func() waitEntry {
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Empty(t, m.Errors)
		var out struct{ WaitlistChanged waitEntry }
		require.NoError(t, json.Unmarshal(m.Data, &out), "%s", m.Data)
		return out.WaitlistChanged
	}
	w := read()
	require.Equal(t, "WAITING", w.Status)
	require.Equal(t, 2, *w.Position)

	// The waiter ahead leaves: the position is pushed.
	var left struct{ LeaveWaitlist waitPayload }
	e.MustDo(t, first, leaveDoc, map[string]any{"i": map[string]any{"sku": "WL-GQL"}}, &left)
	require.Equal(t, "LEFT", left.LeaveWaitlist.Entry.Status)
	require.Nil(t, left.LeaveWaitlist.Entry.Position)
	w = read()
	require.Equal(t, 1, *w.Position)

	// The holder cancels: the unit is offered, pushed, and nobody else gets it.
	require.Empty(t, e.Cancel(t, holder, r.Reservation.Token).UserErrors)
	w = read()
	require.Equal(t, "OFFERED", w.Status)
	require.Nil(t, w.Position)
	require.NotNil(t, w.Reservation)
	require.Equal(t, "HELD", w.Reservation.Status)
	require.WithinDuration(t, time.Now().Add(300*time.Second), w.Reservation.ExpiresAt, 10*time.Second, "the hold lasts what the waiter chose")
	outsider := e.Reserve(t, e.Token(t, "outsider", false), map[string]any{"sku": "WL-GQL", "quantity": 1})
	require.Equal(t, "OUT_OF_STOCK", outsider.UserErrors[0].Code)

	var mine struct{ MyWaitlist []waitEntry }
	e.MustDo(t, second, myWaitlistDoc, nil, &mine)
	require.Len(t, mine.MyWaitlist, 1)
	require.Equal(t, "OFFERED", mine.MyWaitlist[0].Status)
	require.Equal(t, w.Reservation.Token, mine.MyWaitlist[0].Reservation.Token)
	// The offered reservation is the waiter's to commit.
	require.Empty(t, e.Commit(t, second, w.Reservation.Token).UserErrors)
	errs := e.Do(t, "", myWaitlistDoc, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, "UNAUTHENTICATED", errs[0].Code())
}
