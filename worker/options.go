package worker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// DefaultLeaseTTL is Options.LeaseTTL's default, exported so the program's
// configuration refers to it instead of repeating it.
const DefaultLeaseTTL = 10 * time.Second

// Options are the settings every worker shares. GroupConfig passes its
// own down to each worker whose field is zero. Zero values take the defaults
// named on each field.
type Options struct {
	// Owner names this process in leases, in the flusher's consumer group and
	// in logs. It must be unique per process: two processes with one owner
	// would each believe they hold the other's leases. Default
	// "<hostname>-<pid>-<random>".
	Owner string
	// LeaseTTL is how long a partition lease lasts without renewal; default
	// 10 seconds. Leases are renewed every LeaseTTL/3, so a dead process's
	// partitions are taken over between LeaseTTL and LeaseTTL plus one lease
	// check after it stopped renewing. Expiry does not wait for that: the
	// sweepers of the live processes sweep an overdue partition without its
	// lease (HoldSweeperConfig.LateAfter).
	LeaseTTL time.Duration
	// LeaseCheck is how often free partitions are tried and due renewals
	// made; default 500 milliseconds (and never more than LeaseTTL/3).
	LeaseCheck time.Duration
	// StepTimeout bounds every single Redis or Postgres call; default 5 seconds.
	StepTimeout time.Duration
	// MinRestartBackoff and MaxRestartBackoff bound the wait before a failed
	// worker loop is restarted; the wait doubles per consecutive failure.
	// Defaults 100 milliseconds and 10 seconds.
	MinRestartBackoff time.Duration
	MaxRestartBackoff time.Duration
	// Tracer, when set, gives each write-behind batch a span that
	// continues the traces its events carry (Flusher). Nil: tracing off,
	// no span.
	Tracer trace.TracerProvider
}

// inherit fills o's zero fields from parent.
func (o *Options) inherit(parent Options) {
	if o.Owner == "" {
		o.Owner = parent.Owner
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = parent.LeaseTTL
	}
	if o.LeaseCheck == 0 {
		o.LeaseCheck = parent.LeaseCheck
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = parent.StepTimeout
	}
	if o.MinRestartBackoff == 0 {
		o.MinRestartBackoff = parent.MinRestartBackoff
	}
	if o.MaxRestartBackoff == 0 {
		o.MaxRestartBackoff = parent.MaxRestartBackoff
	}
	if o.Tracer == nil {
		o.Tracer = parent.Tracer
	}
}

func (o *Options) setDefaults() {
	if o.Owner == "" {
		o.Owner = defaultOwner()
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.LeaseCheck <= 0 {
		o.LeaseCheck = 500 * time.Millisecond
	}
	if o.LeaseCheck > o.LeaseTTL/3 {
		o.LeaseCheck = o.LeaseTTL / 3
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 5 * time.Second
	}
	if o.MinRestartBackoff <= 0 {
		o.MinRestartBackoff = 100 * time.Millisecond
	}
	if o.MaxRestartBackoff < o.MinRestartBackoff {
		o.MaxRestartBackoff = max(10*time.Second, o.MinRestartBackoff)
	}
}

// defaultOwner is unique per process: the host and pid say where it runs, the
// random part keeps a restarted process with a reused pid apart.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "dropline"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
