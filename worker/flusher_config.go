package worker

import "time"

// FlusherConfig tunes the write-behind flusher. Zero values take the defaults
// named on each field.
type FlusherConfig struct {
	Options
	// Group is the consumer group on every outbox stream; default "dropline".
	// The consumer name is Options.Owner.
	Group string
	// BatchSize is the most events read and applied in one Postgres
	// transaction; default 500.
	BatchSize int
	// PollInterval is the wait after a pass over the owned partitions that
	// read events but no full batch (fewer than BatchSize in each
	// partition), or that left batches waiting for their commit to be
	// durable; default 20 milliseconds. Reads do not block, so one
	// goroutine serves every partition and stops promptly. Under a steady
	// flow the wait is what makes batches large: a partition receiving r
	// events per second is applied in batches of about r times PollInterval
	// (up to BatchSize), and its lag grows by about PollInterval. A longer
	// wait makes fewer, larger batches, each a longer burst of PostgreSQL's
	// work on a machine it shares with the server: in 16 runs alternated
	// between 50 and 20 milliseconds, the reserves paced at 80 % of the
	// maximum had a p99 3.84 times their p50 on average at 50 and 3.61 at
	// 20, for about 2 % less apply capacity (batches of about 400 events
	// instead of 430 at that rate).
	PollInterval time.Duration
	// IdleInterval is the wait after a pass that read nothing and left
	// nothing waiting to be acknowledged; default 50 milliseconds, and
	// never shorter than PollInterval. It is what an idle flusher costs:
	// each pass is a round trip to Redis that reads every owned partition.
	// The first events after a quiet time wait for it, at most this long.
	IdleInterval time.Duration
	// ClaimIdle is how long an event must have been delivered and not
	// acknowledged before it is claimed from its consumer (a dead process, or
	// an event Postgres refused); default 15 seconds.
	ClaimIdle time.Duration
	// ClaimInterval is how often pending events are looked at for claiming;
	// default 1 second.
	ClaimInterval time.Duration
	// TrimInterval is how often acknowledged events are trimmed from the
	// streams and the lag and backlog gauges refreshed; default 1 second.
	TrimInterval time.Duration
	// DrainTimeout bounds the final flush on Stop; default 5 seconds.
	DrainTimeout time.Duration
	// RefuseLimit is how many times Postgres may refuse one event on its own
	// (after its batch was split down to it) before the event is moved to
	// the partition's dead-letter stream, so it stops holding the stream's
	// trim point back; default 5 (with ClaimIdle, about 75 seconds). A
	// negative value keeps refused events pending for ever.
	RefuseLimit int
	// SynchronousCommit makes every batch wait for its commit's WAL flush
	// and be acknowledged at once, as before batches of fresh holds were
	// committed unflushed and acknowledged once durable (the default,
	// flusher_unflushed.go).
	SynchronousCommit bool
}

func (c *FlusherConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Group == "" {
		c.Group = "dropline"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.IdleInterval <= 0 {
		c.IdleInterval = 50 * time.Millisecond
	}
	c.IdleInterval = max(c.IdleInterval, c.PollInterval)
	if c.ClaimIdle <= 0 {
		c.ClaimIdle = 15 * time.Second
	}
	if c.ClaimInterval <= 0 {
		c.ClaimInterval = time.Second
	}
	if c.TrimInterval <= 0 {
		c.TrimInterval = time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 5 * time.Second
	}
	if c.RefuseLimit == 0 {
		c.RefuseLimit = 5
	}
}
