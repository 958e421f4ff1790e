package httpbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// reserveShapedScript does the writes of a reserve and nothing else: take a
// unit, record the hold, index its expiry, append the outbox event. It is
// the floor under reserve.lua: no validation, quota, idempotency, sale window
// or announcement.
const reserveShapedScript = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local left = redis.call('DECRBY', KEYS[1], 1)
if left < 0 then
  redis.call('INCRBY', KEYS[1], 1)
  return 0
end
local exp = now + 600000
redis.call('HSET', KEYS[2], 'sku', 'HOT', 'who', ARGV[1], 'qty', '1', 'st', 'HELD', 'exp', exp, 'ctd', now)
redis.call('ZADD', KEYS[3], exp, KEYS[2])
redis.call('XADD', KEYS[4], '*', 'k', 'reserve', 'tok', KEYS[2], 'sku', 'HOT', 'who', ARGV[1], 'qty', '1', 'exp', exp)
return 1
`

// Baseline is one baseline's throughput and latency.
type Baseline struct {
	Requests  int64
	PerSecond float64
	P50MS     float64
	P99MS     float64
	MaxMS     float64
}

// redisBaseline runs reserveShapedScript by EVALSHA with redis-benchmark.
func redisBaseline(ctx context.Context, addr string, clients int, requests int) (Baseline, error) {
	var b Baseline
	path, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return b, fmt.Errorf("redis-benchmark is not installed (apt-get install redis-tools): %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	const tag = "{rawbench}"
	if err := c.Set(ctx, tag+"stock", 1_000_000_000, 0).Err(); err != nil {
		return b, err
	}
	sha, err := c.ScriptLoad(ctx, reserveShapedScript).Result()
	if err != nil {
		return b, fmt.Errorf("loading the reserve-shaped script: %w", err)
	}
	host, port, _ := net.SplitHostPort(addr)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, path, "-h", host, "-p", port, "-c", strconv.Itoa(clients), //nolint:gosec // our own arguments
		"-n", strconv.Itoa(requests), "-r", "1000000000", "--csv",
		"evalsha", sha, "4", tag+"stock", tag+"hold:__rand_int__", tag+"expiry", tag+"outbox", "buyer-__rand_int__")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return b, fmt.Errorf("redis-benchmark: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil || len(rows) < 2 || len(rows[1]) < 8 {
		return b, fmt.Errorf("redis-benchmark printed %q", out.String())
	}
	f := func(i int) float64 { v, _ := strconv.ParseFloat(rows[1][i], 64); return v }
	// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
	b = Baseline{Requests: int64(requests), PerSecond: f(1), P50MS: f(4), P99MS: f(6), MaxMS: f(7)}
	// The benchmark's keys go: they are not part of what is measured next.
	_ = c.Del(ctx, tag+"stock", tag+"expiry", tag+"outbox").Err()
	return b, nil
}

const pgbenchSetup = `
CREATE TABLE baseline_stock (
  sku       text    PRIMARY KEY,
  available integer NOT NULL CHECK (available >= 0)
);
CREATE TABLE baseline_holds (
  id         bigserial   PRIMARY KEY,
  sku        text        NOT NULL REFERENCES baseline_stock (sku),
  principal  text        NOT NULL,
  quantity   integer     NOT NULL CHECK (quantity > 0),
  expires_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO baseline_stock VALUES ('HOT', 1000000000);`

// pgbenchScript is the PostgreSQL-only reserve: take a unit of the hot row
// if there is one, then insert the hold, in one transaction. The stock never
// runs out, so every UPDATE takes a unit and every INSERT follows one.
const pgbenchScript = `\set buyer random(1, 3000)
BEGIN;
UPDATE baseline_stock SET available = available - 1 WHERE sku = 'HOT' AND available >= 1;
INSERT INTO baseline_holds (sku, principal, quantity, expires_at) VALUES ('HOT', 'buyer-' || :buyer, 1, now() + interval '600 seconds');
END;
`

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// postgresBaseline runs pgbenchScript with pgbench against dbURL.
func postgresBaseline(ctx context.Context, dir, dbURL string, clients int, d time.Duration) (Baseline, error) {
	var b Baseline
	path, err := exec.LookPath("pgbench")
	if err != nil {
		return b, fmt.Errorf("pgbench is not installed (apt-get install postgresql-client): %w", err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return b, err
	}
	_, err = conn.Exec(ctx, pgbenchSetup)
	conn.Close(ctx)
	if err != nil {
		return b, fmt.Errorf("creating the baseline tables: %w", err)
	}
	script := filepath.Join(dir, "reserve.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return b, err
	}
	logDir := filepath.Join(dir, "pgbench")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return b, err
	}
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	cctx, cancel := context.WithTimeout(ctx, d+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, path, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2", //nolint:gosec // our own arguments
		"-T", strconv.Itoa(secs), "-f", script, "-l", "--log-prefix", filepath.Join(logDir, "tx"), dbURL)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return b, fmt.Errorf("pgbench: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	m := tpsLine.FindStringSubmatch(out.String())
	if m == nil {
		return b, fmt.Errorf("pgbench printed no tps: %s", out.String())
	}
	b.PerSecond, _ = strconv.ParseFloat(m[1], 64)
	lat, err := pgbenchLatencies(logDir)
	if err != nil {
		return b, err
	}
	b.Requests = int64(len(lat))
	b.P50MS, b.P99MS, b.MaxMS = percentileMS(lat, 50), percentileMS(lat, 99), percentileMS(lat, 100)
	return b, nil
}

// pgbenchLatencies reads every per-transaction log line pgbench wrote
// ("client tx latency_us script epoch_s epoch_us").
func pgbenchLatencies(dir string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("pgbench wrote no transaction log in %s", dir)
	}
	var lat []time.Duration
	for _, name := range files {
		f, err := os.Open(name) //nolint:gosec // a file pgbench wrote in our directory
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
		f.Close()
	}
	return lat, nil
}

// percentileMS is the p-th percentile of lat in milliseconds (p = 100: the
// maximum). It sorts lat.
func percentileMS(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	i := int(float64(len(lat))*p/100+0.5) - 1
	i = min(max(i, 0), len(lat)-1)
	return float64(lat[i]) / float64(time.Millisecond)
}
