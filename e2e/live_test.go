package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
)

// Live availability (G8) end to end: subscribers of the running App see
// the stock that product.stock reports, within 250 ms of the last change.

const liveStockDoc = `subscription($s: [ID!]!) { stockChanged(skus: $s) { id sku available held sold total updatedAt } }`

func (s *system) wsURL() string { return "ws" + strings.TrimPrefix(s.URL, "http") + "/graphql" }

func (s *system) reserveOver(t *testing.T, token, sku string, qty, holdSeconds int) reservation {
	t.Helper()
	var out struct {
		Reserve struct {
			Reservation *reservation `json:"reservation"`
			UserErrors  []userError  `json:"userErrors"`
		} `json:"reserve"`
	}
	in := map[string]any{"sku": sku, "quantity": qty}
	if holdSeconds > 0 {
		in["holdSeconds"] = holdSeconds
	}
	r := s.gql(t, http.DefaultClient, token, `mutation($i: ReserveInput!) { reserve(input: $i) { reservation { token status quantity expiresAt } userErrors { code message } } }`,
		map[string]any{"i": in}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.Reserve.UserErrors)
	return *out.Reserve.Reservation
}

func (s *system) cancelOver(t *testing.T, token, resToken string) {
	t.Helper()
	var out struct {
		Cancel struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"cancel"`
	}
	r := s.gql(t, http.DefaultClient, token, `mutation($i: CancelInput!) { cancel(input: $i) { userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"token": resToken}}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.Cancel.UserErrors)
}

// liveStock is a stockChanged payload.
type liveStock struct {
	ID  string `json:"id"`
	Sku string `json:"sku"`
	stock
	UpdatedAt time.Time `json:"updatedAt"`
}

// sale reserves and cancels over HTTP, as other clients would, and
// returns when the last mutation has answered.
func (s *system) sale(t *testing.T, sku string, buyers int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range buyers {
		wg.Go(func() {
			tok := s.token(t, buyerName(i), false)
			r := s.reserveOver(t, tok, sku, 1, 0)
			if i%3 == 0 {
				s.cancelOver(t, tok, r.Token)
			}
		})
	}
	wg.Wait()
}

func TestLiveStockOverWebsocket(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	s := start(t)
	s.createProduct(t, "LIVE-WS", 50, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := wsclient.Dial(ctx, s.wsURL(), wsclient.Options{}) // anonymous: stock is public
	require.NoError(t, err)
	defer c.Close()
	sub, err := c.Subscribe(ctx, liveStockDoc, map[string]any{"s": []string{"LIVE-WS"}})
	require.NoError(t, err)

	var mu sync.Mutex
	var last liveStock
	var lastAt time.Time
	first := make(chan struct{})
	go func() {
		for m := range sub.C {
			var out struct{ StockChanged liveStock }
			if len(m.Errors) > 0 || json.Unmarshal(m.Data, &out) != nil {
				t.Errorf("bad payload: %s %+v", m.Data, m.Errors)
				continue
			}
			mu.Lock()
			if lastAt.IsZero() {
				close(first)
			}
			last, lastAt = out.StockChanged, m.At
			mu.Unlock()
		}
	}()
	<-first

	s.sale(t, "LIVE-WS", 30)
	saleEnd := time.Now()
	truth := s.stock(t, "LIVE-WS")
	require.Equal(t, stock{Available: 30, Held: 20, Sold: 0, Total: 50}, truth)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return last.stock == truth
	}, 2*time.Second, 5*time.Millisecond, "the subscriber never saw %+v", truth)
	mu.Lock()
	defer mu.Unlock()
	require.Less(t, lastAt.Sub(saleEnd), 250*time.Millisecond, "G8: converged within 250 ms of the last change")
	require.Equal(t, "U3RvY2s6TElWRS1XUw==", last.ID, "payloads carry the Stock node id")
}

func TestLiveReservationExpires(t *testing.T) {
	t.Parallel()
	s := start(t)
	s.createProduct(t, "LIVE-EXP", 5, 0)
	owner := s.token(t, "owner", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const doc = `subscription($t: ID!) { reservationChanged(token: $t) { token status } }`
	// The owner's connection is open before the hold is made, and its
	// subscription starts right after, so the hold is still HELD when it
	// starts, however slow the machine is to open a websocket.
	c, err := wsclient.Dial(ctx, s.wsURL(), wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer " + owner}})
	require.NoError(t, err)
	defer c.Close()
	r := s.reserveOver(t, owner, "LIVE-EXP", 2, 2)
	sub, err := c.Subscribe(ctx, doc, map[string]any{"t": r.Token})
	require.NoError(t, err)

	other, err := wsclient.Dial(ctx, s.wsURL(), wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer " + s.token(t, "other", false)}})
	require.NoError(t, err)
	defer other.Close()
	refused, err := other.Subscribe(ctx, doc, map[string]any{"t": r.Token})
	require.NoError(t, err)
	m, ok, err := refused.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, m.Errors, 1)
	require.Equal(t, "FORBIDDEN", m.Errors[0].Code())

	var statuses []string
	for m := range sub.C {
		require.Empty(t, m.Errors)
		var out struct{ ReservationChanged reservation }
		require.NoError(t, json.Unmarshal(m.Data, &out))
		statuses = append(statuses, out.ReservationChanged.Status)
	}
	require.Equal(t, []string{"HELD", "EXPIRED"}, statuses, "HELD, then EXPIRED, then completion")
	require.Equal(t, 5, s.stock(t, "LIVE-EXP").Available)

	// A bad token closes with 4403.
	_, err = wsclient.Dial(ctx, s.wsURL(), wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer forged"}})
	require.Equal(t, websocket.StatusCode(4403), websocket.CloseStatus(err), "%v", err)
}

// TestLiveGraphQLWSReferenceClient runs the graphql-ws library with Node
// against the running App. Node is required: the test fails, not skips,
// without it. It installs the locked npm dependencies when they are
// missing.
func TestLiveGraphQLWSReferenceClient(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	node := requireNode(t)
	dir, err := filepath.Abs("node")
	require.NoError(t, err)
	installNodeDeps(t, dir)

	s := start(t)
	s.createProduct(t, "LIVE-NODE", 40, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "subscribe.mjs"), s.wsURL(), s.token(t, "node-watcher", false), "LIVE-NODE")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	type line struct {
		value liveStock
		at    time.Time
	}
	var mu sync.Mutex
	var lines []line
	var failure string
	first := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var out struct {
				Data struct {
					StockChanged liveStock `json:"stockChanged"`
				} `json:"data"`
				Errors []any `json:"errors"`
				Error  any   `json:"error"`
			}
			mu.Lock()
			if err := json.Unmarshal(sc.Bytes(), &out); err != nil || out.Error != nil || len(out.Errors) > 0 {
				failure = sc.Text()
			} else {
				lines = append(lines, line{out.Data.StockChanged, time.Now()})
				if len(lines) == 1 {
					close(first)
				}
			}
			mu.Unlock()
		}
	}()
	select {
	case <-first:
	case <-readDone:
		t.Fatalf("the node client ended before its first value: %s", failure)
	case <-time.After(30 * time.Second):
		t.Fatal("no value from the node client")
	}

	s.sale(t, "LIVE-NODE", 30)
	saleEnd := time.Now()
	truth := s.stock(t, "LIVE-NODE")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lines[len(lines)-1].value.stock == truth
	}, 2*time.Second, 5*time.Millisecond, "the node client never saw %+v", truth)

	require.NoError(t, stdin.Close()) // the script disposes its client and exits
	<-readDone
	require.NoError(t, cmd.Wait())
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, failure)
	last := lines[len(lines)-1]
	require.Equal(t, truth, last.value.stock, "the last value the reference client printed is the truth")
	require.Equal(t, "LIVE-NODE", last.value.Sku)
	require.Less(t, last.at.Sub(saleEnd), 250*time.Millisecond, "G8: converged within 250 ms of the last change")
	t.Logf("graphql-ws client printed %d values; last %+v", len(lines), last.value.stock)
}
