// Package worker is the goroutine group that runs inside every Dropline
// server process next to the HTTP server (section 4 of the contract,
// docs/design.md). It keeps the guarantees that no request path can keep on
// its own:
//
//   - G5, expiry: the HoldSweeper releases due holds through the engine's
//     idempotent release script, found through each partition's expiry index
//     (never keyspace notifications alone), every 100 ms; a partition whose
//     owner died or stalled is swept by any live process once its oldest
//     hold is 250 ms overdue, so expiry never waits for a lease to expire.
//   - G6, complete ledger: the Flusher carries the outbox streams (one per
//     partition, appended inside the same Lua scripts that change stock) into
//     Postgres, at least once, with an idempotent apply.
//   - G2, commits: the CommitReconciler settles commits that a crash or an
//     unknown Postgres outcome left COMMITTING, by asking Postgres. In the
//     same pass it re-applies product changes (restocks, limits, sale
//     windows) that committed in Postgres but whose Redis step failed
//     (products.redis_version < version), version-guarded, so Redis never
//     keeps an old total or window for longer than about one Interval after
//     it answers again.
//   - G7, read-repair: the Rebuilder notices that Redis lost its data and
//     reloads every SKU from Postgres at once; the engine's lazy rebuild on
//     access stays the safety net.
//   - G14, draws: the Drawer runs each draw whose entries have closed, on the
//     process holding its partition's "drawer" lease, and finishes a draw a
//     crash left half carried over to Redis. The lease only saves work: the
//     draw is one Postgres transaction that finds it OPEN, and each batch
//     carried to Redis checks the progress it moves.
//   - Webhooks: the WebhookDispatcher sends the ledger's webhook outbox to
//     the subscribed endpoints, claiming deliveries in Postgres (SKIP
//     LOCKED) rather than by lease, so every process runs one; each attempt
//     runs in a goroutine of its own under a timeout, so an endpoint that
//     hangs holds up nothing but its own deliveries.
//
// # Lifecycle
//
// Each worker has a Config, a NewX constructor, and is a startstop.Service:
// Start(ctx), and an idempotent Stop(ctx) that waits at most until ctx ends.
// Its loop is a ticker and ctx.Done(); every Redis or Postgres call runs under its own StepTimeout. A
// step that fails on one partition (or, for the rebuilder, one SKU) is
// logged, counted in dropline_worker_partition_failures_total and retried
// after its own doubling backoff (MinRestartBackoff to MaxRestartBackoff),
// while the other partitions go on at every tick. A loop that returns an
// error (Redis failing the lease keeper or a measurement) or panics is
// restarted after the same kind of backoff, with an error log line and
// dropline_worker_restarts_total. The Group
// starts the flusher first and stops it last: Stop applies and acknowledges
// the batch in flight, drains what is left for up to DrainTimeout, and only
// then returns, so the caller may close the pools afterwards.
//
// # Sharing the work between processes
//
// Several server processes may run against one Redis and one Postgres. Work
// is cut along the engine's 16 hash-tag partitions, and each worker kind
// (sweeper, flusher, reconciler) owns a partition through a Lease:
//
//	<prefix>{pNN}:lease:<kind>          owner token, PX = LeaseTTL
//	<prefix>{pNN}:lease:<kind>:fence    fencing counter (one INCR per acquisition)
//	<prefix>{p00}:members:<kind>        live processes, for the fair share
//	<prefix>{pNN}:epoch                 random value while Redis keeps its data
//	<prefix>{p00}:primary               replication id of the primary the SKUs were last reloaded for (single primary or Sentinel)
//	<prefix>{p00}:primary:reload:<id>   the process reloading every SKU for primary <id>, PX = 3 LeaseTTL, renewed per SKU
//	<prefix>{p00}:primary:reloaded:<id> the SKUs reloaded for primary <id> so far
//
// A lease is acquired only when free (SET NX PX) or provably stale (no
// expiry at all), renewed every TTL/3 and released only by its owner (Lua
// compare-and-set, lua/lease_*.lua). Locally a holder stops acting two thirds of a TTL after
// its last successful renewal, before anybody else can acquire. Each process
// keeps about Partitions/n leases of each kind (n live members), handing the
// surplus over; a partition nobody takes is taken back after a few checks.
// A clean Stop releases the leases (the supervisor of the loop that took
// them does, once the loop has returned), so the others take over at once; a
// crashed process's leases, or those of a worker whose context ended without
// a Stop, expire after LeaseTTL. Expiry alone cannot wait
// that long: every sweeper also checks the oldest hold of the partitions it
// does not hold (one ZRANGE per partition, every 250 ms) and sweeps, without
// the lease, those more than 250 ms overdue.
//
// Leases only save work: every step is idempotent. The release script
// restocks at most once; db.ApplyEvents keys movements by event id and only
// moves a reservation forward out of HELD; ReconcileCommits settles through
// guarded scripts. The one Postgres writer, the flusher, also fences each
// batch with its lease's token (db.Fence): a flusher paused past its lease
// gets db.ErrFenced rather than writing after its successor. The fencing
// counter is floored at Redis' clock in microseconds so it keeps growing when
// Redis loses the counter itself.
//
// # Failure modes
//
//   - Process crash mid-batch: the batch is committed in Postgres but not
//     acknowledged; it stays pending on the dead consumer and is claimed
//     (XAUTOCLAIM, ClaimIdle) and applied again by the next owner of the
//     partition. Nothing is doubled (event ids are unique).
//   - PostgreSQL crash after a batch committed unflushed (a batch of fresh
//     holds is committed with synchronous_commit off, flusher_unflushed.go):
//     its entries are acknowledged only once a flush position past its
//     commit is read while its session lives (the acknowledgement of what
//     a batch's report showed durable goes to Redis while the next batch
//     is written), so a crash that loses the
//     commit leaves them pending; the failure (or the ended session) makes
//     the flusher read and apply them again.
//   - A read's reply lost (the connection dropped after Redis delivered the
//     entries): the Redis client sends the read again and gets the next
//     entries, with no error, while the first ones stay pending on this
//     consumer. Every ClaimInterval the flusher looks at what is pending on
//     its own consumer (XPENDING, then XCLAIM of all but the entries Postgres
//     refused, which keep aging towards ClaimIdle) and applies it, so such
//     entries reach the ledger within about a second instead of ClaimIdle.
//   - Postgres down: reserves, cancels and expiries go on in Redis; their
//     events wait in the streams (dropline_writebehind_backlog and
//     dropline_writebehind_lag_seconds grow); the flusher's and the
//     reconciler's partitions back off and retry until Postgres answers,
//     then the backlog drains. Commits answer UNAVAILABLE meanwhile (the
//     engine's doing).
//   - Redis flushed or restarted empty: the epoch keys vanish; the rebuilder
//     that recreates one (SET NX) rebuilds that partition's SKUs from
//     Postgres; the flusher recreates its consumer group on NOGROUP, reading
//     the new stream from its start; leases are re-acquired with larger
//     fencing tokens. Holds whose reserve event had not reached Postgres are
//     lost with Redis and their units return to stock (an edge stated in
//     docs/design.md). Events the flusher had read before the loss are
//     written after the rebuild; before acknowledging them, the flusher has
//     the engine tell each rebuilt SKU what the ledger now says of their
//     holds (released, adopted or expired: inventory.Maintenance.ReconcileApplied).
//     If it dies in between, the batch is applied and reconciled again; the
//     commit reconciler's overdue pass (CloseOverdueHolds) is the last net for
//     HELD rows Redis lacks, or has ended without the ledger hearing of it.
//   - Redis failover to a replica that missed the last writes (or a primary
//     restarted from its files): the data is there, the epochs too, but the
//     primary's replication id is new. <prefix>{p00}:primary holds the id
//     of the primary the SKUs were last reloaded for (on Redis Cluster,
//     whose shards have an id each, <prefix>{pNN}:primary holds the id of
//     partition NN's master); when the id differs, the first instance to
//     claim the reload (SET NX, with an expiry it renews as it goes) reloads
//     every SKU the record covers from Postgres although Redis has it
//     (inventory.Maintenance.RebuildStale), lists each SKU it reloaded, and
//     records the new id only once all are done. An instance that dies
//     mid-way leaves the old id recorded; its claim expires, and another
//     instance claims the reload and does the SKUs it left. Each claimer
//     counts dropline_redis_failovers_total once per new id. A sale the new
//     primary never saw is then sold in Redis; holds it had whose events
//     were still in its outbox are applied to the ledger just before their
//     SKU is reloaded, so the reload keeps them.
//   - An entry no batch can apply: one that does not decode, or of a kind
//     or version this version does not know (a newer version wrote it during
//     a rolling upgrade), is moved before the batch to the partition's dead-letter
//     stream (<prefix>{pNN}:outbox:dead) and acknowledged in one MULTI. A
//     batch Postgres refuses on its values (db.ErrRefused: a constraint or a
//     data exception) is split in halves until the refused events are alone;
//     the others are applied, each refused one stays pending, is retried
//     every ClaimIdle, is counted in
//     dropline_writebehind_events_refused_total, and after RefuseLimit
//     refusals is dead-lettered too. Dead letters are logged and counted in
//     dropline_writebehind_dead_lettered_total{reason}; they hold neither
//     the flow nor the stream's trim point back. A database behind this
//     version's migrations (db.ErrSchemaBehind: a table, column or function
//     missing) refuses nothing: its batches fail like an outage and are
//     retried until `dropline migrate` has run.
//   - Streams are trimmed (XTRIM MINID) only below the lowest pending entry,
//     or below the last delivered one when nothing is pending, so nothing
//     unapplied is ever trimmed.
package worker
