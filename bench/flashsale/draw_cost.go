package flashsale

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/internal/machine"
)

// EntryCost is what the draw's entries cost, read before and after them:
// the CPU time of each process that served them, per first entry (the
// second entries' cost included), and how the servers grouped them into
// Postgres transactions. On a shared machine the rate is the machine's;
// the CPU per entry is the path's: on a quiet machine of Cores cores, with
// nothing else running, the entries could go no faster than
// Cores ÷ TotalUs per µs.
type EntryCost struct {
	// ServersUs is each server's CPU per entry (process_cpu_seconds_total
	// on its /metrics), in µs; DriverUs this driver's; PostgresUs the run
	// database's backends' (zero without the ledger); RedisUs the
	// redis-server's (INFO cpu; zero without --redis-url).
	ServersUs  []float64 `json:"serversUs"`
	DriverUs   float64   `json:"driverUs"`
	PostgresUs float64   `json:"postgresUs"`
	RedisUs    float64   `json:"redisUs"`
	// TotalUs is the sum of the above.
	TotalUs float64 `json:"totalUs"`
	// MachineBusy is the share of the machine's CPU time that was busy
	// (every process, the other tenants' included) while the entries ran;
	// near 1, the entries waited for a core.
	MachineBusy float64 `json:"machineBusy"`
	// Cores is the machine's; QuietRate is Cores ÷ TotalUs, in entries/s.
	Cores     int     `json:"cores"`
	QuietRate float64 `json:"quietRate"`
	// Transactions is how many Postgres transactions recorded the entries
	// (dropline_draw_entry_batch_size_count, summed over the servers), and
	// PerTransaction the requests each recorded on average.
	Transactions   int     `json:"transactions"`
	PerTransaction float64 `json:"perTransaction"`
	// LoadBefore and LoadAfter are the load averages at either end.
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
}

// costReading is one reading of what EntryCost compares.
type costReading struct {
	self    time.Duration
	servers []float64
	batches float64 // sum of the batch histogram's _count
	batched float64 // sum of its _sum
	pg      map[int]time.Duration
	redis   float64 // seconds
	busy    machine.Busy
	load    string
}

// readCost reads every counter EntryCost compares; rdb is the servers'
// Redis (nil: not read).
func (d *Driver) readCost(ctx context.Context, rdb *redis.Client) costReading {
	r := costReading{self: machine.SelfCPU(), busy: machine.ReadBusy(), load: machine.LoadAverage()}
	for _, c := range d.clients {
		m := scrape(ctx, c)
		r.servers = append(r.servers, m["process_cpu_seconds_total"])
		r.batches += m["dropline_draw_entry_batch_size_count"]
		r.batched += m["dropline_draw_entry_batch_size_sum"]
	}
	if d.ledger != nil {
		r.pg = d.ledger.backends(ctx)
	}
	if rdb != nil {
		r.redis = redisCPU(ctx, rdb)
	}
	return r
}

// entryCost is EntryCost between two readings, for entries first entries
// and requests requests in all.
func entryCost(before, after costReading, entries, requests int, cores int) EntryCost {
	per := func(d float64) float64 { return d / float64(max(entries, 1)) * 1e6 }
	c := EntryCost{Cores: cores, LoadBefore: before.load, LoadAfter: after.load, MachineBusy: after.busy.Since(before.busy)}
	for i := range after.servers {
		us := per(after.servers[i] - before.servers[i])
		c.ServersUs = append(c.ServersUs, us)
		c.TotalUs += us
	}
	c.DriverUs = per((after.self - before.self).Seconds())
	c.PostgresUs = per(machine.CPUSince(before.pg, after.pg).Seconds())
	c.RedisUs = per(after.redis - before.redis)
	c.TotalUs += c.DriverUs + c.PostgresUs + c.RedisUs
	if c.TotalUs > 0 {
		c.QuietRate = float64(cores) / c.TotalUs * 1e6
	}
	c.Transactions = int(after.batches - before.batches)
	if c.Transactions > 0 {
		c.PerTransaction = float64(requests) / float64(c.Transactions)
	}
	return c
}

// scrape reads the unlabelled samples of a server's /metrics by name;
// empty when it cannot be read.
func scrape(ctx context.Context, c *Client) map[string]float64 {
	out := map[string]float64{}
	u := c.siteURL("/metrics")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return out
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	return out
}

// redisCPU is the CPU seconds (user and system) redis-server has used so
// far, from INFO cpu; 0 when it cannot be read.
func redisCPU(ctx context.Context, rdb *redis.Client) float64 {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}

// backends is the CPU time so far of each PostgreSQL backend connected to
// the ledger's database (this reader's own included), by process id: a
// loopback server's backends are processes of this machine.
func (r *LedgerReader) backends(ctx context.Context) map[int]time.Duration {
	rows, err := r.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil
	}
	return machine.CPUByPid(pids)
}

// writeEntryCost is the text report's lines on the entries' cost.
func writeEntryCost(b *strings.Builder, d *DrawResult) {
	c := d.EntryCost
	servers := make([]string, len(c.ServersUs))
	for i, us := range c.ServersUs {
		servers[i] = strconv.FormatFloat(us, 'f', 0, 64)
	}
	fmt.Fprintf(b, "  %d requests with the second entries (%.0f/s); %d Postgres transactions, %.1f requests each\n",
		d.Entrants+d.Replays, d.RequestsPerSecond, c.Transactions, c.PerTransaction)
	fmt.Fprintf(b, "  CPU per entry: servers %s µs, postgres %.0f µs, redis %.0f µs, this driver %.0f µs; %.0f µs in all, so %d cores with nothing else on them: %.0f entries/s\n",
		strings.Join(servers, " + "), c.PostgresUs, c.RedisUs, c.DriverUs, c.TotalUs, c.Cores, c.QuietRate)
	fmt.Fprintf(b, "  machine %.0f %% busy while the entries ran; load average %s before, %s after\n",
		c.MachineBusy*100, c.LoadBefore, c.LoadAfter)
}
