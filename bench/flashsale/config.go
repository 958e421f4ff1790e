package flashsale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// Bounds on a drop, so a typo cannot turn a rehearsal into a denial of
// service or an afternoon-long run.
const (
	MaxBuyers      = 200_000
	MaxConcurrency = 2_000
	MaxDuration    = 10 * time.Minute
	MaxRetries     = 10
	// DefaultQuietCommits and MaxQuietCommits bound --quiet-commits.
	DefaultQuietCommits = 300
	MaxQuietCommits     = 5_000
)

// Config describes one drop. DefaultConfig gives a meaningful drop that
// finishes in seconds against a local `dropline serve`.
type Config struct {
	// Targets are the base URLs of the Dropline servers ("http://host:port",
	// optionally ending in /graphql); buyers are spread round-robin.
	// No default: a rehearsal creates its SKUs on the target, so it is
	// never `make run`'s demo shop unless asked for by name.
	Targets []string
	// AllowRemote permits targets that are not loopback addresses. Off by
	// default: a load test pointed at production by mistake is an outage.
	AllowRemote bool
	// Secret signs the buyers' and the admin's tokens (DROPLINE_JWT_SECRET,
	// or the development secret with --dev).
	Secret []byte
	// Buyers is how many distinct principals try to buy (one reserve each,
	// plus retries). Default 5000, at most MaxBuyers.
	Buyers int
	// Concurrency is how many buyers are in flight at once. Default 64.
	Concurrency int
	// SKU is the product on sale. Empty: a fresh "FLASH-<run>" is created
	// with Stock units and MaxPerUser; set: the existing SKU is used as is.
	SKU string
	// Stock is the units of a created SKU. Default 100.
	Stock int
	// MaxPerUser is the per-user limit of a created SKU; 0 means none.
	// Default 1.
	MaxPerUser int
	// Quantity is the units each buyer asks for. Default 1.
	Quantity int
	// CommitRatio and CancelRatio are the shares of winning buyers who
	// commit and cancel; the rest abandon their hold and let it expire.
	// Defaults 0.7 and 0.1.
	CommitRatio float64
	CancelRatio float64
	// Hold is the hold duration asked for (whole seconds, 1s-1h). Default 60s.
	Hold time.Duration
	// Think is the most a winning buyer waits before committing or
	// cancelling (uniformly random), like a checkout page. Default 20ms.
	Think time.Duration
	// Duration bounds the drop; buyers not started by then are skipped.
	// Default 45s, at most MaxDuration.
	Duration time.Duration
	// Timeout bounds each request; a timed-out request is retried with the
	// same idempotency key or token. Default 5s.
	Timeout time.Duration
	// Retries is how many times a request with an unknown outcome (timeout,
	// transport error, UNAVAILABLE, RATE_LIMITED) is sent again. Default 3.
	Retries int
	// DatabaseURL locates the Postgres ledger the verdict reads. Empty
	// skips the ledger checks.
	DatabaseURL string
	// RedisURL locates the servers' Redis, whose CPU time the draw
	// rehearsal reads (INFO cpu) to give its CPU per entry. Empty: not
	// read.
	RedisURL string
	// DrainTimeout bounds the wait for the write-behind to drain and the
	// ledger to agree with the live stock. Default 20s.
	DrainTimeout time.Duration
	// Seed makes the commit/cancel/abandon choices and think times
	// repeatable. Default: 1.
	Seed int64
	// RunID names this run in principals, idempotency keys and the SKU.
	// Default: derived from the clock.
	RunID string
	// Progress receives a progress bar; nil shows none.
	Progress ProgressSink
	// Status receives one line per phase of the watchers; nil says nothing.
	Status func(string)

	// Waiters, when positive, adds the waitlist rehearsal after the drop
	// (RunWaitlist): a fresh SKU of Stock units sold out to as many
	// holders, Waiters buyers queued for it, then every holder cancelling
	// while outsiders reserve; its checks join the verdict. At most
	// MaxWaiters; 0: none.
	Waiters int

	// Mode is ModeDrop (the default, also "": the drop alone) or ModeDraw: the drop,
	// then the draw rehearsal (RunDraw) on a SKU of Stock units sold by
	// draw that Entrants buyers enter, closing DrawWindow after it is
	// created; its checks join the verdict.
	Mode string
	// Entrants is how many buyers enter the draw rehearsal (1 to
	// MaxEntrants); default 1000.
	Entrants int
	// DrawWindow is how long the rehearsal's draw takes entries; every
	// entry must be in by then. Default 10 seconds.
	DrawWindow time.Duration
	// DrawWatchers is how many of the entrants (spread evenly over them)
	// watch their entry with myDrawEntryChanged, each on a websocket of its
	// own, to time the push of the result; 0 to MaxDrawWatchers, default
	// 1000 (never more than the entrants).
	DrawWatchers int

	// With Mode ModeQueue, the drop is followed by the queue rehearsal
	// (RunQueue) on a SKU of Stock units behind an admission queue that
	// opens QueueWindow (default 10s) after its creation, admits
	// QueueAdmitPerMinute (default 6000), hands out passes of
	// QueuePassSeconds (default 15) and asks QueuePowBits of proof of work
	// (default 8; 0: none), and with QueueAccessCodes one presale code per
	// principal. QueuePeople principals (default 2000, at most
	// MaxQueuePeople, at least Stock) join once, QueueEarly of them
	// (default 0.7) before the opening; QueuePollers of them (default 0.2)
	// poll myQueueTicket, the rest watch queueChanged. QueueBots principals
	// (default 200, at most QueuePeople) are bots with QueueBotConns
	// connections each (default 4, at most MaxQueueBotConns).
	QueuePeople         int
	QueueBots           int
	QueueBotConns       int
	QueuePollers        float64
	QueueEarly          float64
	QueueWindow         time.Duration
	QueueAdmitPerMinute int
	QueuePassSeconds    int
	QueuePowBits        int
	QueueAccessCodes    bool

	// Watchers is how many live subscribers of stockChanged watch the
	// drop, each on its own connection (0: none). Before the buyers come,
	// Changes reserves of one unit are made at ChangeRate per second and
	// their delivery to every watcher is timed; after the drop every
	// watcher must converge to the final stock. At most MaxWatchers.
	Watchers int
	// WatchTransport is TransportWS (graphql-transport-ws, the default) or
	// TransportSSE.
	WatchTransport string
	// WatchSKUs is how many SKUs the watchers watch, spread evenly: 1 (the
	// default) is the drop's hot SKU; more creates WATCH-<run>-<i> SKUs of
	// Stock units besides it (the many-SKUs mode: 1000 SKUs x 10 watchers).
	WatchSKUs int
	// Changes and ChangeRate are the measured changes; defaults 40 at 20
	// per second. In the many-SKUs mode each change touches
	// ceil(WatchSKUs/Changes) SKUs.
	Changes    int
	ChangeRate float64
	// SourceAddrs is how many loopback source addresses (127.0.0.2 up)
	// the watchers are spread over, so a per-address cap of the server
	// does not decide the figure. 0: one per PerSourceAddr watchers.
	SourceAddrs int
	// ConvergeTimeout bounds the wait for every watcher to reach the last
	// measured change, and the final stock after the drop. Default 5s.
	ConvergeTimeout time.Duration
	// WatchP99 is the delivery p99 the verdict requires (default 250 ms,
	// G8's bound); WatchRSSKiB the server memory per idle watcher (default
	// 32 KiB). Zero or negative: reported, not checked.
	WatchP99    time.Duration
	WatchRSSKiB float64
	// QuietCommits is how many reserve-and-commit pairs, one after the
	// other on a SKU of their own, time the commit on a quiet server
	// before the buyers come (default 300; 0: none). The report divides
	// the drop's commit p99 by theirs. Their p99 is the nearest rank, so
	// below 100 commits it is their slowest one: 300 makes it the 4th
	// slowest, about as many commits as a 500-unit storm makes.
	QuietCommits int
	// FloorURL is a fan-out floor (`bench-floor ws`, bench/floor): with
	// websocket watchers, as many watchers of it and as many changes are
	// measured before the server's, and the server's CPU per delivery is
	// divided by the floor's. Empty: no floor.
	FloorURL string
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Buyers:       5000,
		Concurrency:  64,
		Stock:        100,
		MaxPerUser:   1,
		Quantity:     1,
		CommitRatio:  0.7,
		CancelRatio:  0.1,
		Hold:         60 * time.Second,
		Think:        20 * time.Millisecond,
		Duration:     45 * time.Second,
		Timeout:      5 * time.Second,
		Retries:      3,
		DrainTimeout: 20 * time.Second,
		Seed:         1,

		QuietCommits:    DefaultQuietCommits,
		WatchTransport:  TransportWS,
		WatchSKUs:       1,
		Changes:         40,
		ChangeRate:      20,
		ConvergeTimeout: 5 * time.Second,
		WatchP99:        250 * time.Millisecond,
		WatchRSSKiB:     32,

		Mode:         ModeDrop,
		Entrants:     1000,
		DrawWindow:   10 * time.Second,
		DrawWatchers: 1000,

		QueuePeople:         2000,
		QueueBots:           200,
		QueueBotConns:       4,
		QueuePollers:        0.2,
		QueueEarly:          0.7,
		QueueWindow:         10 * time.Second,
		QueueAdmitPerMinute: 6000,
		QueuePassSeconds:    15,
		QueuePowBits:        8,
	}
}

// Validate checks the bounds and that every target is allowed. It resolves
// host names, so it takes a context.
func (c Config) Validate(ctx context.Context) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Targets) == 0 {
		bad("no target URL: give --url (the rehearsal creates its SKUs on that server), or run `make flashsale`, which starts a server and a database of its own")
	}
	for _, t := range c.Targets {
		if err := checkTarget(ctx, t, c.AllowRemote); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Secret) < 32 {
		bad("a JWT secret of at least 32 bytes is needed to mint tokens: set DROPLINE_JWT_SECRET or pass --dev")
	}
	if c.Buyers < 1 || c.Buyers > MaxBuyers {
		bad("--buyers must be 1-%d", MaxBuyers)
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		bad("--concurrency must be 1-%d", MaxConcurrency)
	}
	if c.SKU == "" && c.Stock < 0 {
		bad("--stock must not be negative")
	}
	if c.MaxPerUser < 0 {
		bad("--max-per-user must not be negative")
	}
	if c.Quantity < 1 || c.Quantity > 100 {
		bad("--quantity must be 1-100")
	}
	if c.CommitRatio < 0 || c.CancelRatio < 0 || c.CommitRatio+c.CancelRatio > 1.0000001 {
		bad("--commit and --cancel must be >= 0 and add up to at most 1 (the rest abandon)")
	}
	if c.Hold < time.Second || c.Hold > time.Hour || c.Hold%time.Second != 0 {
		bad("--hold must be whole seconds between 1s and 1h")
	}
	if c.Think < 0 || c.Think > time.Minute {
		bad("--think must be 0-1m")
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		bad("--duration must be >0 and at most %s", MaxDuration)
	}
	if c.Timeout <= 0 || c.Timeout > time.Minute {
		bad("--timeout must be >0 and at most 1m")
	}
	if c.Retries < 0 || c.Retries > MaxRetries {
		bad("--retries must be 0-%d", MaxRetries)
	}
	if c.DrainTimeout <= 0 || c.DrainTimeout > MaxDuration {
		bad("--drain-timeout must be >0 and at most %s", MaxDuration)
	}
	switch c.Mode {
	case "", ModeDrop:
	case ModeDraw:
		if c.Entrants < 1 || c.Entrants > MaxEntrants {
			bad("--entrants must be 1-%d", MaxEntrants)
		}
		if c.DrawWatchers < 0 || c.DrawWatchers > MaxDrawWatchers {
			bad("--draw-watchers must be 0-%d", MaxDrawWatchers)
		}
		if c.DrawWindow < time.Second || c.DrawWindow > MaxDuration {
			bad("--draw-window must be at least 1s and at most %s", MaxDuration)
		}
		if c.Stock < 1 {
			bad("--mode draw needs --stock of at least 1: the draw gives out that many units")
		}
	case ModeQueue:
		c.validateQueue(bad)
	default:
		bad("--mode must be %q, %q or %q", ModeDrop, ModeDraw, ModeQueue)
	}
	if c.Waiters < 0 || c.Waiters > MaxWaiters {
		bad("--waitlist must be 0-%d", MaxWaiters)
	}
	if c.Waiters > 0 && c.Stock < 1 {
		bad("--waitlist needs --stock of at least 1: the rehearsal sells that many units out and frees them")
	}
	if c.QuietCommits < 0 || c.QuietCommits > MaxQuietCommits {
		bad("--quiet-commits must be 0-%d", MaxQuietCommits)
	}
	if c.Watchers > 0 {
		c.validateWatch(bad)
	} else if c.Watchers < 0 {
		bad("--watchers must be 0-%d", MaxWatchers)
	}
	return errors.Join(errs...)
}

// checkTarget refuses malformed URLs and, unless remote targets are
// allowed, any host that does not resolve to loopback addresses only.
func checkTarget(ctx context.Context, raw string, allowRemote bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %q: want http(s)://host[:port]", raw)
	}
	if allowRemote {
		return nil
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("target %q is not a loopback address: pass --allow-remote to load-test another machine", raw)
		}
		return nil
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("target %q: %w", raw, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("target %q resolves to %s, not loopback: pass --allow-remote to load-test another machine", raw, a.IP)
		}
	}
	return nil
}

func (c Config) validateWatch(bad func(string, ...any)) {
	if c.Watchers > MaxWatchers {
		bad("--watchers must be 0-%d", MaxWatchers)
	}
	if c.WatchTransport != TransportWS && c.WatchTransport != TransportSSE {
		bad("--watch-transport must be %q or %q", TransportWS, TransportSSE)
	}
	if c.WatchSKUs < 1 || c.WatchSKUs > MaxWatchSKU || c.WatchSKUs > c.Watchers {
		bad("--watch-skus must be 1-%d and at most --watchers", MaxWatchSKU)
	}
	if c.Changes < 1 || c.Changes > MaxChanges {
		bad("--changes must be 1-%d", MaxChanges)
	}
	if c.ChangeRate <= 0 || c.ChangeRate > 1000 {
		bad("--change-rate must be >0 and at most 1000 per second")
	}
	if c.SKU == "" && c.Changes > c.Stock {
		bad("--changes must not exceed --stock: each change takes one unit")
	}
	if c.SourceAddrs < 0 || c.SourceAddrs > MaxSourceAddrs {
		bad("--source-addrs must be 0-%d", MaxSourceAddrs)
	}
	if c.ConvergeTimeout <= 0 || c.ConvergeTimeout > time.Minute {
		bad("--converge-timeout must be >0 and at most 1m")
	}
}

func (c Config) validateQueue(bad func(string, ...any)) {
	if c.QueuePeople < 1 || c.QueuePeople > MaxQueuePeople {
		bad("--queue-people must be 1-%d", MaxQueuePeople)
	}
	if c.Stock < 1 || c.Stock > c.QueuePeople {
		bad("--mode queue needs --stock of 1 to --queue-people: the people alone can buy it out")
	}
	if c.QueueBots < 1 || c.QueueBots > c.QueuePeople {
		bad("--queue-bots must be 1 to --queue-people")
	}
	if c.QueueBotConns < 1 || c.QueueBotConns > MaxQueueBotConns {
		bad("--queue-bot-conns must be 1-%d", MaxQueueBotConns)
	}
	if c.QueuePollers < 0 || c.QueuePollers > 1 || c.QueueEarly < 0 || c.QueueEarly > 1 {
		bad("--queue-pollers and --queue-early must be shares between 0 and 1")
	}
	if c.QueueWindow < 2*time.Second || c.QueueWindow > MaxDuration {
		bad("--queue-window must be at least 2s and at most %s", MaxDuration)
	}
	if c.QueueAdmitPerMinute < 1 || c.QueueAdmitPerMinute > 1_000_000 {
		bad("--admit-per-minute must be 1-1000000")
	}
	if c.QueuePassSeconds < 10 || c.QueuePassSeconds > 120 {
		bad("--pass-seconds must be 10-120: the first bot admitted keeps its pass that long")
	}
	if c.QueuePowBits < 0 || c.QueuePowBits > 20 {
		bad("--pow-bits must be 0-20: every principal solves it")
	}
}
