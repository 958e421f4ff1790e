package httpbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// reserveQuery is the mutation every driver sends: the shape a storefront
// uses (the hold's token and expiry, or the reason).
const reserveQuery = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`

func reserveBody(sku string) string {
	b, _ := json.Marshal(map[string]any{
		"query":     reserveQuery,
		"variables": map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}},
	})
	return string(b)
}

// wrkScript rotates through the buyers' tokens (each thread starting at its
// own offset, every request the next buyer) and sorts the answers into held,
// out of stock, rate limited and other; done() prints one JSON line.
const wrkScript = `
local tokens = {}
for line in io.lines(os.getenv("BENCH_TOKENS")) do tokens[#tokens + 1] = line end
local body = io.open(os.getenv("BENCH_BODY")):read("*a")
local threads = {}
local nthreads = tonumber(os.getenv("BENCH_THREADS"))

-- BENCH_RATE, when set, paces each thread to that many requests per
-- millisecond: every request has its slot on a fixed schedule (LuaJIT's ffi
-- reads the monotonic clock) and waits for it, so the offered rate does not
-- follow the latency.
local rate = tonumber(os.getenv("BENCH_RATE") or "0")
if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
    int clock_gettime(int clk, bench_timespec *tp);
  ]]
  local ts = ffi.new("bench_timespec")
  local function now_ms()
    ffi.C.clock_gettime(1, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
  end
  local t0, slot = nil, 0
  function delay()
    local now = now_ms()
    t0 = t0 or now
    local due = t0 + slot / rate
    slot = slot + 1
    if due <= now then return 0 end
    return due - now
  end
end

function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end

local reqs, i, n = {}, 0, 0
held, oos, limited, other, failed = 0, 0, 0, 0, 0

function init(args)
  n = #tokens
  for k = 1, n do
    reqs[k] = wrk.format("POST", "/graphql", {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. tokens[k],
    }, body)
  end
  i = math.floor(offset * n / nthreads)
end

function request()
  i = i % n + 1
  return reqs[i]
end

function response(status, headers, b)
  if status ~= 200 then
    failed = failed + 1
  elseif b:find('"token":"', 1, true) then
    held = held + 1
  elseif b:find('OUT_OF_STOCK', 1, true) then
    oos = oos + 1
  elseif b:find('RATE_LIMITED', 1, true) then
    limited = limited + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local h, o, l, x, f = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    h = h + t:get("held"); o = o + t:get("oos"); l = l + t:get("limited")
    x = x + t:get("other"); f = f + t:get("failed")
  end
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"errors_connect":%d,"errors_read":%d,"errors_write":%d,"errors_status":%d,"errors_timeout":%d,' ..
    '"held":%d,"out_of_stock":%d,"rate_limited":%d,"other":%d,"failed":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, h, o, l, x, f,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
`

// WrkResult is one wrk run.
type WrkResult struct {
	Requests      int64 `json:"requests"`
	DurationUS    int64 `json:"duration_us"`
	ErrorsConnect int64 `json:"errors_connect"`
	ErrorsRead    int64 `json:"errors_read"`
	ErrorsWrite   int64 `json:"errors_write"`
	ErrorsStatus  int64 `json:"errors_status"`
	ErrorsTimeout int64 `json:"errors_timeout"`
	Held          int64 `json:"held"`
	OutOfStock    int64 `json:"out_of_stock"`
	RateLimited   int64 `json:"rate_limited"`
	Other         int64 `json:"other"`
	Failed        int64 `json:"failed"`
	P50US         int64 `json:"p50_us"`
	P90US         int64 `json:"p90_us"`
	P99US         int64 `json:"p99_us"`
	MaxUS         int64 `json:"max_us"`
	// CPU is the user plus system CPU time wrk itself used: the load
	// generator's share of the machine.
	CPU time.Duration `json:"-"`
}

// Seconds is the measured duration.
func (w WrkResult) Seconds() float64 { return float64(w.DurationUS) / 1e6 }

// PerSecond is the rate of n over the run.
func (w WrkResult) PerSecond(n int64) float64 {
	if w.DurationUS == 0 {
		return 0
	}
	return float64(n) / w.Seconds()
}

// socketErrors sums wrk's transport errors.
func (w WrkResult) socketErrors() int64 {
	return w.ErrorsConnect + w.ErrorsRead + w.ErrorsWrite + w.ErrorsTimeout
}

// wrkRun drives base/graphql with wrk for d, as the buyers whose tokens
// are in tokensFile, each request reserving one unit of sku.
type wrkRun struct {
	dir         string
	base        string
	tokensFile  string
	sku         string
	connections int
	threads     int
	duration    time.Duration
	// rate, when > 0, is the offered rate in requests per second (paced);
	// 0 sends as fast as the connections allow.
	rate float64
}

func (r wrkRun) run(ctx context.Context) (WrkResult, error) {
	var res WrkResult
	path, err := exec.LookPath("wrk")
	if err != nil {
		return res, fmt.Errorf("wrk is not installed (apt-get install wrk): %w", err)
	}
	script := filepath.Join(r.dir, "reserve.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o600); err != nil {
		return res, err
	}
	body := filepath.Join(r.dir, "body-"+r.sku+".json")
	if err := os.WriteFile(body, []byte(reserveBody(r.sku)), 0o600); err != nil {
		return res, err
	}
	secs := max(int(r.duration.Round(time.Second)/time.Second), 1)
	cctx, cancel := context.WithTimeout(ctx, r.duration+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, path, "-t", strconv.Itoa(r.threads), "-c", strconv.Itoa(r.connections), //nolint:gosec // our own arguments
		"-d", strconv.Itoa(secs)+"s", "--timeout", "5s", "-s", script, r.base+"/graphql")
	cmd.Env = append(os.Environ(), "BENCH_TOKENS="+r.tokensFile, "BENCH_BODY="+body, "BENCH_THREADS="+strconv.Itoa(r.threads),
		"BENCH_RATE="+strconv.FormatFloat(r.rate/float64(r.threads)/1000, 'f', -1, 64))
	var out, errOut bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errOut
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("wrk: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "BENCHJSON "); ok {
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				return res, fmt.Errorf("wrk summary %q: %w", rest, err)
			}
			res.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			return res, nil
		}
	}
	return res, fmt.Errorf("wrk printed no summary: %s %s", out.String(), errOut.String())
}
