package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// skuIn returns a SKU name of partition p (SKUs hash to partitions by
// crc32 % 16).
func skuIn(prefix string, p int) string {
	for i := 0; ; i++ {
		if s := fmt.Sprintf("%s-%d", prefix, i); inventory.PartitionOf(s) == p {
			return s
		}
	}
}

// metricValue reads one series (name and labels exactly as exposed) from a
// process's /metrics; 0 when absent.
func metricValue(t *testing.T, p *proc, series string) float64 {
	t.Helper()
	resp, err := quickClient.Get(p.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	require.NoError(t, sc.Err())
	return 0
}

func quantiles(ds []time.Duration) (p50, p99, worst time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration { return s[min(max(int(float64(len(s))*q+0.5)-1, 0), len(s)-1)] }
	return at(0.5), at(0.99), s[len(s)-1]
}

// sideTraffic reserves and cancels one unit at a time on skus, round robin,
// until stop closes, each as its own buyer (so no per-buyer rate limit
// applies). It returns the tokens whose reserve and cancel were both
// acknowledged.
func sideTraffic(s *system, skus []string, stop <-chan struct{}) func() []string {
	var mu sync.Mutex
	var done []string
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		client := &http.Client{Timeout: 10 * time.Second}
		defer client.CloseIdleConnections()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // the traffic's pace
			}
			live := s.live()
			if len(live) == 0 {
				continue
			}
			p := live[0]
			user := fmt.Sprintf("side-%05d", i)
			bearer, err := s.Issuer.Mint(user, false, time.Hour)
			if err != nil {
				panic(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			r := post(ctx, client, p.URL, bearer, reserveMutation, map[string]any{"input": map[string]any{
				"sku": skus[i%len(skus)], "quantity": 1, "idempotencyKey": "side-" + user, "holdSeconds": 60}})
			var out struct {
				Reserve struct {
					Reservation *struct{ Token string } `json:"reservation"`
				} `json:"reserve"`
			}
			if r.Err != nil || r.Status != http.StatusOK || len(r.Errors) > 0 || unmarshal(r.Data, &out) != nil || out.Reserve.Reservation == nil {
				cancel()
				continue
			}
			tok := out.Reserve.Reservation.Token
			c := post(ctx, client, p.URL, bearer, cancelMutation, map[string]any{"token": tok})
			cancel()
			var co struct {
				Cancel struct {
					Reservation *struct{ Status string } `json:"reservation"`
				} `json:"cancel"`
			}
			if c.Err == nil && c.Status == http.StatusOK && len(c.Errors) == 0 && unmarshal(c.Data, &co) == nil &&
				co.Cancel.Reservation != nil && co.Cancel.Reservation.Status == "CANCELLED" {
				mu.Lock()
				done = append(done, tok)
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return done
	}
}

// Outbox entries this version cannot apply land in one partition's stream
// in the middle of a drop on that partition's SKU: one of a kind a newer
// version could write during a rolling upgrade, and one that does not
// decode. Meanwhile every other partition carries reserves and cancels.
// The drop's ledger is complete (verify), every other partition's ledger
// keeps up (each movement's recorded_at - occurred_at stays small), both
// entries end in the partition's dead-letter stream, counted by reason, and
// nothing else is lost.
func TestPoisonOutboxEntryMidDrop(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	const poisoned = 0 // the flusher visits partitions in order: the first is the worst place
	dropSKU := skuIn("POISON", poisoned)
	var side []string
	for p := range inventory.Partitions {
		if p != poisoned {
			side = append(side, skuIn("SIDE", p))
			s.createProduct(a, side[len(side)-1], 1000, 0)
		}
	}
	stopSide := make(chan struct{})
	sideDone := sideTraffic(s, side, stopSide)
	d := startDrop(s, dropConfig{SKU: dropSKU, Buyers: scale(150, 500), Pace: 20 * time.Millisecond, DoubleCommit: 0.2})
	d.waitProgress(t, d.cfg.Buyers/3)

	injected := time.Now()
	ctx := context.Background()
	outbox := s.Keys.Outbox(poisoned)
	nowMs := strconv.FormatInt(injected.UnixMilli(), 10)
	unknown, err := s.RDB.XAdd(ctx, &redis.XAddArgs{Stream: outbox, Values: map[string]any{
		"id": "refund:poison-token", "type": "refund", "tok": "poison-token", "sku": dropSKU, "who": "poison-buyer",
		"qty": "1", "exp": nowMs, "ctd": nowMs, "at": nowMs}}).Result()
	require.NoError(t, err)
	malformed, err := s.RDB.XAdd(ctx, &redis.XAddArgs{Stream: outbox, Values: map[string]any{"garbage": "\x00\xff not an event"}}).Result()
	require.NoError(t, err)

	d.wait(t)
	close(stopSide)
	sideTokens := sideDone()
	d.verify(t, verifyOpts{})

	// Every other partition's reserves and cancels are in the ledger once.
	eventually(t, 30*time.Second, "the side traffic reached the ledger", func() (bool, string) {
		missing := 0
		for _, tok := range sideTokens {
			missing += 2 - s.scalar(`SELECT count(*)::int FROM stock_movements WHERE event_id IN ($1, $2)`, "reserve:"+tok, "cancel:"+tok)
		}
		return missing == 0, fmt.Sprintf("%d movements missing of %d", missing, 2*len(sideTokens))
	})
	require.NotEmpty(t, sideTokens)
	// The ledger kept up after the poison arrived: how long each movement
	// took from Redis (occurred_at, Redis' clock) to Postgres (recorded_at).
	var lags []time.Duration
	rows, err := s.Pool.Query(ctx, `SELECT extract(epoch FROM recorded_at - occurred_at)::float8 FROM stock_movements
		WHERE occurred_at >= $1 AND kind <> 'create'`, injected)
	require.NoError(t, err)
	for rows.Next() {
		var sec float64
		require.NoError(t, rows.Scan(&sec))
		lags = append(lags, time.Duration(sec*float64(time.Second)))
	}
	require.NoError(t, rows.Err())
	p50, p99, worst := quantiles(lags)
	require.NotEmpty(t, lags)
	require.Less(t, worst, 3*time.Second, "the ledger kept up with every partition after the poison arrived")

	// Both poison entries are set aside, with their reasons, and counted.
	dead, err := s.RDB.XRange(ctx, outbox+":dead", "-", "+").Result()
	require.NoError(t, err)
	got := map[string]string{}
	for _, e := range dead {
		got[fmt.Sprint(e.Values["dead_entry"])] = fmt.Sprint(e.Values["dead_reason"])
	}
	require.Equal(t, map[string]string{unknown: "unknown_kind", malformed: "malformed"}, got)
	require.Equal(t, 1.0, metricValue(t, a, `dropline_writebehind_dead_lettered_total{reason="unknown_kind"}`))
	require.Equal(t, 1.0, metricValue(t, a, `dropline_writebehind_dead_lettered_total{reason="malformed"}`))
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM reservations WHERE token = 'poison-token'`))
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM stock_movements WHERE sku = $1 AND kind NOT IN ('create', 'reserve', 'commit', 'cancel', 'expire')`, dropSKU))
	d.figures(t, "poison-outbox-entry", 2, fmt.Sprintf("side_holds=%d ledger_lag_after_poison p50=%s p99=%s max=%s over %d movements dead_lettered=%d",
		len(sideTokens), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond), len(lags), len(dead)))
}

// Two instances split the sweeper leases; holds of 2 s are spread over all
// 16 partitions, and the instance holding half of the sweeper leases is
// SIGKILLed just before the first falls due. Its leases live on for 10 s,
// yet every hold's units are available again within 1 s of its expiresAt
// (measured per hold from Redis: the release time the script stamps minus
// expiresAt), and the ledger shows exactly one expire per hold.
func TestInstanceKilledExpiryWithinASecond(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	b := s.start("b")
	const perSKU = 4
	skus := make([]string, inventory.Partitions)
	for p := range skus {
		skus[p] = skuIn("EXPIRY", p)
		s.createProduct(b, skus[p], perSKU, 0)
	}
	ctx := context.Background()
	aOwner := fmt.Sprintf("-%d-", a.cmd.Process.Pid)
	var aParts []int
	eventually(t, 20*time.Second, "the two instances split the sweeper leases 8/8", func() (bool, string) {
		aParts = aParts[:0]
		owners := map[string]int{}
		for p := range inventory.Partitions {
			v, err := s.RDB.Get(ctx, s.Keys.Base(p)+"lease:sweeper").Result()
			if err != nil {
				return false, fmt.Sprintf("partition %d: %v", p, err)
			}
			owners[v]++
			if strings.Contains(v, aOwner) {
				aParts = append(aParts, p)
			}
		}
		return len(owners) == 2 && len(aParts) == inventory.Partitions/2, fmt.Sprint(owners)
	})

	// The holds, through the survivor-to-be, as fast as it answers.
	type hold struct {
		sku, token string
		exp        time.Time
	}
	var (
		mu    sync.Mutex
		holds []hold
		wg    sync.WaitGroup
	)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	for i := range inventory.Partitions * perSKU {
		wg.Go(func() {
			user := fmt.Sprintf("expiry-%03d", i)
			r := post(ctx, client, b.URL, s.token(user, false), reserveMutation, map[string]any{"input": map[string]any{
				"sku": skus[i%inventory.Partitions], "quantity": 1, "idempotencyKey": "k-" + user, "holdSeconds": 2}})
			var out struct {
				Reserve struct {
					Reservation *struct {
						Token     string `json:"token"`
						ExpiresAt string `json:"expiresAt"`
					} `json:"reservation"`
					UserErrors []userError `json:"userErrors"`
				} `json:"reserve"`
			}
			if r.Err != nil || unmarshal(r.Data, &out) != nil || out.Reserve.Reservation == nil {
				t.Errorf("reserve %d: %v %v %s", i, r.Err, r.Errors, r.Data)
				return
			}
			exp, err := time.Parse(time.RFC3339Nano, out.Reserve.Reservation.ExpiresAt)
			if err != nil {
				t.Errorf("expiresAt %q: %v", out.Reserve.Reservation.ExpiresAt, err)
				return
			}
			mu.Lock()
			holds = append(holds, hold{sku: skus[i%inventory.Partitions], token: out.Reserve.Reservation.Token, exp: exp})
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, holds, inventory.Partitions*perSKU)
	first := holds[0].exp
	for _, h := range holds {
		if h.exp.Before(first) {
			first = h.exp
		}
	}
	lead := time.Until(first)
	time.Sleep(lead - 200*time.Millisecond) // the fault's timing: just before the first hold falls due
	a.kill(t)
	killedBefore := time.Until(first)

	// Per hold, from Redis: released (EXPIRED) and when, on Redis' clock.
	var all, orphaned []time.Duration
	aHas := map[int]bool{}
	for _, p := range aParts {
		aHas[p] = true
	}
	eventually(t, 20*time.Second, "every hold expired in Redis", func() (bool, string) {
		all, orphaned = all[:0], orphaned[:0]
		for _, h := range holds {
			p := inventory.PartitionOf(h.sku)
			v, err := s.RDB.HMGet(ctx, s.Keys.Hold(p, h.token), "st", "exp", "end").Result()
			if err != nil {
				return false, err.Error()
			}
			if v[0] != "EXPIRED" {
				return false, fmt.Sprintf("hold %s of partition %d is %v", h.token, p, v[0])
			}
			exp, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
			end, _ := strconv.ParseInt(fmt.Sprint(v[2]), 10, 64)
			d := time.Duration(end-exp) * time.Millisecond
			all = append(all, d)
			if aHas[p] {
				orphaned = append(orphaned, d)
			}
		}
		return true, ""
	})
	p50, p99, worst := quantiles(all)
	op50, op99, oworst := quantiles(orphaned)
	t.Logf("killed %s before the first expiry; %d holds: release delay p50 %s p99 %s max %s; the %d in the dead instance's %d partitions: p50 %s p99 %s max %s",
		killedBefore.Round(time.Millisecond), len(all), p50, p99, worst, len(orphaned), len(aParts), op50, op99, oworst)
	require.Len(t, orphaned, len(aParts)*perSKU)
	require.LessOrEqual(t, worst, time.Second, "every hold's units are back within 1 s of its expiresAt")
	for _, sku := range skus {
		st := s.stockOf(sku)
		require.Equal(t, stock{Available: perSKU, Total: perSKU}, st, sku)
	}

	// The ledger: one expire per hold, once the survivor's flusher took the
	// dead instance's partitions over (lease TTL) and claimed what it had
	// left pending (claim idle).
	eventually(t, 60*time.Second, "the ledger has every expiry", func() (bool, string) {
		n := s.scalar(`SELECT count(*)::int FROM stock_movements WHERE kind = 'expire'`)
		return n == len(holds), fmt.Sprintf("%d expire movements of %d", n, len(holds))
	})
	for _, h := range holds {
		require.Equal(t, 1, s.scalar(`SELECT count(*)::int FROM stock_movements WHERE event_id = $1`, "expire:"+h.token), h.token)
		require.Zero(t, s.scalar(`SELECT count(*)::int FROM stock_movements WHERE token = $1 AND kind IN ('commit', 'cancel')`, h.token))
		require.Equal(t, "EXPIRED", s.scalarText(`SELECT status FROM reservations WHERE token = $1`, h.token))
	}
	require.Equal(t, s.scalar(`SELECT count(*)::int FROM stock_movements`), s.scalar(`SELECT count(DISTINCT event_id)::int FROM stock_movements`))
	t.Logf("FIGURES instance-killed-expiry: holds=%d partitions=%d dead_instance_partitions=%d killed_before_first_expiry=%s release_delay p50=%s p99=%s max=%s dead_partitions p50=%s p99=%s max=%s",
		len(all), inventory.Partitions, len(aParts), killedBefore.Round(time.Millisecond), p50, p99, worst, op50, op99, oworst)
}

func unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

func (s *system) scalarText(query string, args ...any) string {
	s.t.Helper()
	var v string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(s.t, s.Pool.QueryRow(ctx, query, args...).Scan(&v), query)
	return v
}
