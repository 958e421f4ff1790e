package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
)

// The demo shop in a real browser: Playwright (e2e/browser/shop.test.mjs)
// drives Chromium as two buyers against the real `dropline serve` binary in
// dev mode, running the shop's trusted documents
// (web/shop/persisted-query-manifest.json), and this test checks in
// Postgres what their clicks did.

// shopHold is the server's default hold in this test: long enough to click
// Pay, short enough to watch a hold expire.
const shopHold = 4 * time.Second

// chromiumPath is the browser Playwright drives: Debian's chromium package
// (`make tools` installs it), since Playwright's own browser downloads are not
// available everywhere.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

func TestShopInABrowser(t *testing.T) {
	// Its pages must see a buy within a second and an expiry within two:
	// bounds three browsers on a core shared with another package's race
	// tests can miss.
	testenv.Quiet(t)
	t.Parallel()
	node := requireNode(t)
	_, err := os.Stat(chromiumPath())
	require.NoError(t, err, "chromium is required for the browser test: `make tools` installs it (or set CHROMIUM)")
	dir, err := filepath.Abs("browser")
	require.NoError(t, err)
	installNodeDeps(t, dir)

	manifest, err := filepath.Abs("../web/shop/persisted-query-manifest.json")
	require.NoError(t, err)
	srv := startBinary(t, map[string]string{
		"DROPLINE_DEV":               "1",
		"DROPLINE_HOLD_DEFAULT":      shopHold.String(),
		"DROPLINE_TRUSTED_DOCUMENTS": manifest,
	})
	s := &system{URL: srv.URL, Issuer: devIssuer(t), Pool: srv.Pool}
	const sku, last, wait = "SHOP-HOT", "SHOP-LAST", "SHOP-WAIT"
	s.createProduct(t, sku, 5, 0)
	s.createProduct(t, last, 1, 0)
	s.createProduct(t, wait, 1, 0)
	const cartSKU = "SHOP-CART"
	s.createProduct(t, cartSKU, 2, 0)
	// dave holds the waitlist SKU's one unit; the browser test lets it go
	// once bob and carol are in line.
	dave := s.token(t, "dave", false)
	daveHold := s.reserveHTTP(t, dave, wait, 600)
	// The draw closes a minute from now: the buyers enter first, the other
	// steps run, then the browser test waits for the result.
	const drawSKU = "SHOP-DRAW"
	s.createDrawProduct(t, drawSKU, 1, time.Now().Add(time.Minute))
	seedHash := s.draw(t, drawSKU).SeedHash
	// The queued drop opens 45 s from now, lets one ticket in every 10 s
	// and asks each join for 10 bits of proof of work.
	const queueSKU = "SHOP-QUEUE"
	s.createQueuedProduct(t, queueSKU, 2, time.Now().Add(45*time.Second))
	// A presale drop of two products, one unit each, behind one queue that
	// is open already, lets one in a second, asks for 12 bits of proof of
	// work and an access code per buyer.
	const dropID = "SHOP-PRESALE"
	dropSKUs := []string{"SHOP-PRESALE-S", "SHOP-PRESALE-M"}
	dropCodes := []string{"EARLY-ALICE-7Q", "EARLY-CAROL-3K", "EARLY-SPARE-9X"}
	s.createPresaleDrop(t, dropID, dropSKUs, dropCodes)

	artifacts := t.TempDir()
	resultFile := filepath.Join(artifacts, "result.json")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", filepath.Join(dir, "shop.test.mjs"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"SHOP_URL="+srv.URL+"/shop/",
		"SHOP_SKU="+sku,
		"SHOP_LAST_SKU="+last,
		"SHOP_HOLD_MS="+strconv.FormatInt(shopHold.Milliseconds(), 10),
		"SHOP_WAIT_SKU="+wait,
		"SHOP_CART_SKU="+cartSKU,
		"SHOP_QUEUE_SKU="+queueSKU,
		"SHOP_DROP="+dropID,
		"SHOP_DROP_SKUS="+strings.Join(dropSKUs, ","),
		"SHOP_DROP_CODES="+strings.Join(dropCodes[:2], ","),
		"SHOP_DRAW_SKU="+drawSKU,
		"SHOP_DRAW_SEED_HASH="+seedHash,
		"SHOP_WAIT_HOLD="+daveHold,
		"SHOP_DAVE_TOKEN="+dave,
		"SHOP_RESULT="+resultFile,
		"SHOP_ARTIFACTS="+artifacts,
		"CHROMIUM="+chromiumPath(),
	)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Keep the screenshots: t.TempDir would remove them.
		kept, _ := os.MkdirTemp("", "dropline-shop-failure-")
		_ = os.CopyFS(kept, os.DirFS(artifacts))
		t.Fatalf("the browser test failed (%v); screenshots in %s\n%s\nserver log:\n%s", err, kept, out, srv.log.String())
	}
	var res struct {
		ByID         int            `json:"byId"`
		AsText       int            `json:"asText"`
		FallMs       int64          `json:"fallMs"`
		ExpiryBackMs int64          `json:"expiryBackMs"`
		RetryKey     string         `json:"retryKey"`
		ExtendKey    string         `json:"extendKey"`
		DrawWinner   string         `json:"drawWinner"`
		QueueOrder   []string       `json:"queueOrder"`
		QueueSeen    []int          `json:"queuePositions"`
		SoldOutMs    int64          `json:"soldOutMs"`
		TicketAsks   map[string]int `json:"ticketAsks"`
		FallbackAsks int            `json:"fallbackAsks"`
	}
	b, err := os.ReadFile(resultFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &res))

	// What the clicks did, in the ledger. Sales are written before commit
	// answers; reservations arrive through the write-behind, so wait.
	require.Equal(t, 2, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'bob' AND quantity = 1`, sku), "bob's Pay made a sale, and so did his cart")
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'bob' AND quantity = 2`, cartSKU), "bob's cart bought both units")
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'alice'`, last), "alice bought the last unit")
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'carol'`, wait), "carol bought the unit the waitlist handed her")
	require.Contains(t, []string{"alice", "bob"}, res.DrawWinner)
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = $2`, drawSKU, res.DrawWinner), "the draw's winner paid")
	// The queue let in its first two tickets, in order, and each bought
	// one unit; the third was told SOLD_OUT.
	require.Len(t, res.QueueOrder, 3)
	for i, who := range res.QueueOrder {
		want := 0
		if i < 2 {
			want = 1
		}
		require.Equal(t, want, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = $2`, queueSKU, who), "%s, let in %d", who, i+1)
	}
	require.Equal(t, stock{Available: 0, Held: 0, Sold: 2, Total: 2}, s.stock(t, queueSKU))
	// The presale: alice and carol each bought one product of the drop
	// with their pass, with their own code; bob, who brought alice's, got
	// no ticket.
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'alice'`, dropSKUs[0]), "alice bought the drop's first product")
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = $1 AND principal = 'carol'`, dropSKUs[1]), "carol bought the drop's second product")
	require.Equal(t, 2, s.scalar(t, `SELECT count(*) FROM queue_access_codes WHERE queue_id = $1 AND principal IS NOT NULL`, "drop:"+dropID), "two codes used")
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM queue_access_codes WHERE queue_id = $1 AND principal = 'alice'`, "drop:"+dropID), "alice's code is hers, though bob brought it too")
	require.Equal(t, 10, s.scalar(t, `SELECT count(*) FROM sales`), "no other sale")
	drawn := s.draw(t, drawSKU)
	require.Equal(t, "DRAWN", drawn.Status)
	require.Equal(t, 2, drawn.Entries)
	require.NotNil(t, drawn.Seed)
	seed, err := hex.DecodeString(*drawn.Seed)
	require.NoError(t, err)
	sum := sha256.Sum256(seed)
	require.Equal(t, seedHash, hex.EncodeToString(sum[:]), "the seed the page showed hashes to the hash it showed before")
	want := map[string]int{"bob/COMMITTED": 2, "alice/EXPIRED": 1, "alice/CANCELLED": 3, "carol/CANCELLED": 1}
	var got map[string]int
	require.Eventually(t, func() bool {
		got = ledgerStatuses(t, srv.Pool, sku)
		return fmt.Sprint(got) == fmt.Sprint(want)
	}, 10*time.Second, 50*time.Millisecond, "reservations of %s in Postgres: %v, want %v", sku, got, want)
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM reservations WHERE sku = $1 AND principal = 'alice' AND status = 'COMMITTED'`, last))
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM reservations r WHERE sku = $1 AND principal = 'bob' AND status = 'COMMITTED' AND extensions = 1
			AND NOT EXISTS (SELECT 1 FROM sales s WHERE s.token = r.token AND s.cart IS NOT NULL)`, sku) == 1
	}, 10*time.Second, 50*time.Millisecond, "bob's Pay extended the hold once, though the page sent the extension twice")
	require.NotEmpty(t, res.ExtendKey)
	// The waitlist: dave's unit went to bob (first in line), bob's cancel
	// to carol, and it was never on sale in between.
	wantWait := map[string]int{"dave/CANCELLED": 1, "bob/CANCELLED": 1, "carol/COMMITTED": 1}
	require.Eventually(t, func() bool {
		got = ledgerStatuses(t, srv.Pool, wait)
		return fmt.Sprint(got) == fmt.Sprint(wantWait)
	}, 10*time.Second, 50*time.Millisecond, "reservations of %s in Postgres: %v, want %v", wait, got, wantWait)
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM waitlist_entries WHERE sku = $1 AND status = 'OFFERED' AND principal IN ('bob', 'carol')`, wait) == 2
	}, 10*time.Second, 50*time.Millisecond, "bob's and carol's waitlist entries were each offered a unit")
	require.Equal(t, stock{Available: 0, Held: 0, Sold: 1, Total: 1}, s.stock(t, wait))
	require.Equal(t, stock{Available: 3, Held: 0, Sold: 2, Total: 5}, s.stock(t, sku))
	require.Equal(t, stock{Available: 0, Held: 0, Sold: 2, Total: 2}, s.stock(t, cartSKU))
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM carts WHERE principal = 'bob' AND lines = 2`), "one cart sold; the refused one held nothing")
	require.Zero(t, s.scalar(t, `SELECT count(*) FROM reservations WHERE extensions > 1`), "every Pay extended once")
	require.Equal(t, stock{Available: 0, Held: 0, Sold: 1, Total: 1}, s.stock(t, last))
	require.NotEmpty(t, res.RetryKey)
	// Dev mode would run a document sent as text; the shop sent none.
	require.Zero(t, res.AsText, "operations the shop sent as text")
	require.Positive(t, res.ByID)

	t.Logf("browser test took %s; %d operations sent by id, %d as text; bob's page showed alice's Buy after %d ms; an expired hold was back on both pages %d ms after expiresAt; "+
		"the queue's positions %v, SOLD_OUT %d ms after the last sale, tickets asked for %v while pushed to, %d times by a page without websocket",
		time.Since(began).Round(time.Millisecond), res.ByID, res.AsText, res.FallMs, res.ExpiryBackMs, res.QueueSeen, res.SoldOutMs, res.TicketAsks, res.FallbackAsks)
}

// reserveHTTP holds units of sku for the holder of token for holdSeconds
// and returns the reservation's token.
func (s *system) reserveHTTP(t *testing.T, token, sku string, holdSeconds int) string {
	t.Helper()
	var out struct {
		Reserve struct {
			Reservation *reservation `json:"reservation"`
			UserErrors  []userError  `json:"userErrors"`
		} `json:"reserve"`
	}
	r := s.gql(t, http.DefaultClient, token, reserveMutation,
		map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "holdSeconds": holdSeconds}}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.Reserve.UserErrors)
	return out.Reserve.Reservation.Token
}

// createDrawProduct creates sku with units sold by draw, entries open now
// and closing at closes; winners' holds last two minutes.
func (s *system) createDrawProduct(t *testing.T, sku string, units int, closes time.Time) {
	t.Helper()
	var out struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	r := s.gql(t, http.DefaultClient, s.token(t, "ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "name": "E2E " + sku, "price": map[string]any{"amount": 9900, "currency": "EUR"},
			"stock": units, "draw": map[string]any{"closesAt": closes.UTC().Format(time.RFC3339Nano), "winnerHoldSeconds": 120}}}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.CreateProduct.UserErrors)
}

// createQueuedProduct creates sku with units sold behind an admission
// queue that opens at opens, lets a ticket in every 10 seconds and asks
// each join for 10 bits of proof of work.
func (s *system) createQueuedProduct(t *testing.T, sku string, units int, opens time.Time) {
	t.Helper()
	var out struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	r := s.gql(t, http.DefaultClient, s.token(t, "ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "name": "E2E " + sku, "price": map[string]any{"amount": 15900, "currency": "EUR"},
			"stock": units, "queue": map[string]any{"opensAt": opens.UTC().Format(time.RFC3339Nano), "admitPerMinute": 6, "passSeconds": 120, "proofOfWorkBits": 10}}}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.CreateProduct.UserErrors)
}

// createPresaleDrop creates a drop of skus (one unit each, one per
// person across them) behind a queue open from now on that lets one in a
// second, asks each join for 12 bits of proof of work and one of codes.
func (s *system) createPresaleDrop(t *testing.T, drop string, skus, codes []string) {
	t.Helper()
	admin := s.token(t, "ops", true)
	var created struct {
		CreateDrop struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createDrop"`
	}
	r := s.gql(t, http.DefaultClient, admin,
		`mutation($input: CreateDropInput!) { createDrop(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"id": drop, "name": "Presale: trainers", "maxPerUser": 1,
			"queue": map[string]any{"opensAt": time.Now().UTC().Format(time.RFC3339Nano), "admitPerMinute": 60, "passSeconds": 120,
				"proofOfWorkBits": 12, "accessCodes": codes}}}, &created)
	require.Empty(t, r.Errors)
	require.Empty(t, created.CreateDrop.UserErrors)
	for _, sku := range skus {
		var out struct {
			CreateProduct struct {
				UserErrors []userError `json:"userErrors"`
			} `json:"createProduct"`
		}
		r := s.gql(t, http.DefaultClient, admin,
			`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
			map[string]any{"input": map[string]any{"sku": sku, "name": "Trainers, size " + sku[strings.LastIndex(sku, "-")+1:],
				"price": map[string]any{"amount": 12900, "currency": "EUR"}, "stock": 1, "drop": drop}}, &out)
		require.Empty(t, r.Errors)
		require.Empty(t, out.CreateProduct.UserErrors)
	}
}

// ledgerStatuses counts the reservations of sku in Postgres by principal and status.
func ledgerStatuses(t *testing.T, pool *pgxpool.Pool, sku string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT principal || '/' || status, count(*) FROM reservations WHERE sku = $1 GROUP BY 1`, sku)
	require.NoError(t, err)
	m := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		m[k] = n
	}
	require.NoError(t, rows.Err())
	return m
}

// devIssuer mints tokens with the built-in development secret, which a
// server in dev mode without DROPLINE_JWT_SECRET accepts.
func devIssuer(t *testing.T) *auth.Issuer {
	t.Helper()
	cfg := config.Default()
	cfg.Dev = true
	iss, err := app.NewIssuer(cfg)
	require.NoError(t, err)
	return iss
}

// dropline builds the real binary into the test's temporary directory (the
// build cache makes every build after the first a link), so nothing is
// left behind.
func dropline(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dropline")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/dropline/dropline/cmd/dropline").CombinedOutput()
	require.NoError(t, err, "building dropline:\n%s", out)
	return bin
}

// binaryServer is one `dropline serve` process with its own database and
// key prefix.
type binaryServer struct {
	URL  string
	Pool *pgxpool.Pool
	log  *testenv.LogBuffer
}

// startBinary runs `dropline serve` on a free loopback port with env added
// to its environment, waits until /readyz answers 200, and stops it with
// SIGTERM when the test ends.
func startBinary(t *testing.T, env map[string]string) *binaryServer {
	t.Helper()
	bin := dropline(t)
	dbURL := testenv.NewDatabase(t)
	prefix := testenv.Redis(t).Prefix
	redisURL := os.Getenv("REDIS_URL")
	if redisURL == "" {
		redisURL = testenv.DefaultRedisURL
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.TempDir(),
		"REDIS_URL=" + redisURL,
		"DATABASE_URL=" + dbURL,
		"DROPLINE_ADDR=127.0.0.1:0",
		"DROPLINE_KEY_PREFIX=" + prefix,
		"DROPLINE_LOG_FORMAT=json",
		"DROPLINE_SHUTDOWN_TIMEOUT=5s",
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	srv := &binaryServer{log: &testenv.LogBuffer{}}
	addr := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = srv.log.Write([]byte(line + "\n"))
			var m struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &m) == nil && m.Message == "dropline is serving" {
				select {
				case addr <- m.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("dropline did not stop on SIGTERM:\n%s", srv.log.String())
		}
	})
	select {
	case a := <-addr:
		srv.URL = "http://" + a
	case <-exited:
		t.Fatalf("dropline exited at start:\n%s", srv.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("dropline did not report its address:\n%s", srv.log.String())
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "dropline never became ready:\n%s", srv.log.String())
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv.Pool = pool
	return srv
}

// postDevToken asks url's /dev/token for a token for user.
func postDevToken(t *testing.T, url, body string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Post(url+"/dev/token", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestDevTokenOnlyInDevMode: the shop's dev sign-in mints buyer tokens the
// server accepts, never admin ones, and does not exist outside dev mode.
func TestDevTokenOnlyInDevMode(t *testing.T) {
	t.Parallel()

	prod := start(t) // DROPLINE_JWT_SECRET set, dev mode off
	status, out := postDevToken(t, prod.URL, `{"user":"eve"}`)
	require.Equal(t, http.StatusNotFound, status)
	require.Empty(t, out["token"])
	resp, err := http.Get(prod.URL + "/shop/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the shop itself is served in every mode")

	srv := startBinary(t, map[string]string{"DROPLINE_DEV": "1"})
	dev := &system{URL: srv.URL, Issuer: devIssuer(t), Pool: srv.Pool}
	status, out = postDevToken(t, dev.URL, `{"user":"eve"}`)
	require.Equal(t, http.StatusOK, status)
	tok := out["token"]
	require.NotEmpty(t, tok)

	// The server takes it as eve's...
	var mine struct {
		MyReservations struct {
			Edges []any `json:"edges"`
		} `json:"myReservations"`
	}
	r := dev.gql(t, http.DefaultClient, tok, `{ myReservations { edges { cursor } } }`, nil, &mine)
	require.Empty(t, r.Errors, "a buyer token the server accepts")
	// ...and as a buyer's only.
	var created struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	r = dev.gql(t, http.DefaultClient, tok,
		`mutation { createProduct(input: {sku: "EVE-1", name: "x", price: {amount: 1, currency: "EUR"}, stock: 1}) { userErrors { code message } } }`, nil, &created)
	require.Empty(t, r.Errors)
	require.Len(t, created.CreateProduct.UserErrors, 1)
	require.Equal(t, "FORBIDDEN", created.CreateProduct.UserErrors[0].Code)

	status, out = postDevToken(t, dev.URL, `{"user":"eve","admin":true}`)
	require.Equal(t, http.StatusBadRequest, status, "asking for admin is refused")
	require.Empty(t, out["token"])
	status, out = postDevToken(t, dev.URL, `{"user":"not a valid id!"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, out["error"], "not a valid id!")
}
