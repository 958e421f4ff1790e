// Package inventory is Dropline's stock and hold engine: the only code that
// decides whether a buyer gets a unit. Resolvers and workers call it; it calls
// Redis (through the Lua scripts of package lua) and the Postgres ledger
// (package db).
//
// # Packages
//
// Engine keeps the holds (reserve, commit, cancel, extend, read) and hands
// out the other aggregates: Carts, Waitlists, Draws, Drops and Catalog.
// Carts (package inventory/cart), draws (inventory/draw), drops
// (inventory/drop) and waitlists (inventory/waitlist) are packages of their
// own; each is handed the engine's core (package inventory/core: the Redis
// client, ledger, key layout, script runner, metrics, and the hand-offs of
// the holds an aggregate needs; a cart asks what more it needs of the holds
// its lines are through cart.Holds, a draw through draw.Holds) and imports,
// of the engine's packages, only it, the script layer (inventory/script),
// the sale policy (inventory/policy) and the outcomes (inventory/outcome):
// never another aggregate, never this package (internal/archtest's layers
// check it). The catalog is still files of this package, kept apart by
// TestAggregatesStayApart (see units.go).
//
// # Lifecycle of a reservation
//
//	reserve --> HELD --commit--> COMMITTED        (in Postgres before the reply)
//	             |  \--cancel--> CANCELLED        (units back to available)
//	             |\----expiry---> EXPIRED          (units back to available, once)
//	             \--extend--> HELD                (a later expiry, within bounds)
//
// Inside Redis a commit passes through COMMITTING, a state the expiry sweeper
// cannot touch; clients see it as HELD.
//
// # Key layout
//
// The keyspace is cut into Partitions (16) hash-tag partitions. A SKU belongs
// to partition crc32(sku) % 16, or, if it joined a drop, to its drop's,
// crc32(drop) % 16 (see Drops); every key of that SKU carries the tag, so a
// script touching them runs on one Redis Cluster slot:
//
//	dl:{p07}:sku:<sku>              hash   total avail held sold max start end ver seq upd gen drop mode
//	                                       walk walkq: where an unfinished waitlist walk stopped (see core/walk.go)
//	dl:{p07}:hold:<token>           hash   sku who qty st exp ctd cmt end idem fp gen cst cmv ext xid x:<hash> cart prov
//	dl:{p07}:quota:<sku>            hash   principal -> units held or bought (the per-user quota)
//	dl:{p07}:idem:<hash>            hash   first outcome of an idempotency key (hold 24 h, rejection 5 min)
//	dl:{p07}:expiry                 zset   HELD tokens by expiry, in ms
//	dl:{p07}:committing             zset   COMMITTING tokens by start, for the reconciler
//	dl:{p07}:outbox                 stream ledger events (the write-behind outbox, read through Outbox)
//	dl:{p07}:outbox:dead            stream outbox entries the write-behind could not apply, for an operator
//	dl:{p07}:avail:<sku>            sharded pub/sub channel announcing stock
//	dl:{p07}:rebuild:<sku>          hash   gen next: a rebuild under way (see Read-repair)
//	dl:{p07}:rebuild:<sku>:quota    hash   the quota hash that rebuild stages
//	dl:{p07}:wait:<sku>             zset   the waitlist's queue: WAITING principals by entry seq
//	dl:{p07}:waiters:<sku>          hash   principal -> "seq|qty|hold_ms|W or O|token|joined_ms"; #seq: the last seq
//	dl:{p07}:walks                  zset   SKUs whose waitlist walk is unfinished, by when it was left (ms)
//	dl:{p07}:draw:<sku>             hash   done: entries of a draw's result apply_draw.lua has written;
//	                                       short:<token>: why a winner could not be held
//	dl:{p07}:drawn:<sku>            sharded pub/sub channel saying a draw's result is applied in full
//	dl:{p07}:rebuild:<sku>:wait     zset   the queue a rebuild stages
//	dl:{p07}:rebuild:<sku>:waiters  hash   the entries a rebuild stages
//	dl:{pNN}:cart:<token>           hash   who st ctd dl exp lines idem fp rej: a cart, in its home partition
//	dl:{pNN}:cartidem:<hash>        hash   first outcome of a cart's idempotency key (in the key's partition)
//	dl:{pNN}:cartpending            zset   PENDING carts by deadline, HELD ones by expiry (ms), walked by the cart sweep
//	dl:{p07}:drop:<id>              hash   max start end ver skus: a drop, in its own partition
//	dl:{pNN}:idemclaim:<hash>       string the SKU an idempotency key was first used with (as long as its record)
//	dl:{pNN}:idemclaims             string until when (ms) new-looking claims are checked in Postgres
//	dl:{p00}:layout                 hash   layout compat: the layout of the data under the prefix (see LayoutVersion)
//
// gen is the generation of the SKU's life in Redis: every rebuild starts a new
// one, and a hold counts only while it carries its SKU's generation, so a hold
// left over from an earlier life can never move units. The quota counts of a
// SKU live in one hash that a rebuild replaces whole, so a count left by a
// hold of an earlier life cannot refuse a buyer either. cst identifies the
// commit attempt under way and cmv says whether it moved the hold out of HELD
// (see below). ext counts the hold's extensions and xid is the id of the
// last extension call, x:<hash> the idempotency key of each extension a
// client made with one (see Extending a hold). Every outbox event carries
// the generation its hold lived in, and the extensions its hold had. A hold
// made without an idempotency key has no idem and fp fields, and an event
// leaves idem and fp out when they are empty and ext when it is 0: every
// reader, of every EventVersion, takes a missing field as empty or 0, and
// the common hold and event are that much shorter for Redis to write and
// the write-behind to read.
//
// Tokens look like "r07.<26 base32 chars>": the second the token was made
// and 96 random bits, prefixed by the partition, so a commit finds its hold
// without a lookup (the second first keeps the ledger's token indexes
// local; see core.NewTokenOf). A line of a cart
// is "l07.", a cart "c07." (its home partition). Keys (package script)
// builds every name; nothing else formats a key. The table above is checked
// against Keys (TestTheLayoutTableIsTheKeys), and so are lib.lua's key
// helpers (TestLibDerivesKeysAsKeysDoes).
//
// # Carts
//
// A cart's lines live in their SKUs' partitions, so in several Cluster
// slots, and are held in steps (ReserveCart): open_cart.lua (PENDING, with
// a deadline CartSettle away, in the home partition's cartpending index),
// hold_cart_lines.lua per partition (every line of the partition or none,
// as provisional holds: cart = the cart, prov = 1, expiring at the
// deadline, with no outbox event), confirm_cart_lines.lua per partition
// (the cart's expiry, prov removed, the reserve event appended; refused
// after the deadline), finish_cart.lua (HELD, only from PENDING; a cart
// refused or failed is deleted, its key's record keeping a refusal). The
// cart sweep (AbandonStaleCarts) turns a cart still PENDING
// past its deadline into ABANDONED, in the step finish_cart.lua also needs,
// and releases every line it names: after the deadline no line can be held
// or confirmed, so those are all it has. Provisional holds that are let go
// emit no event (lib.lua's release) and keep their hash only as long as a
// refusal (RejectionTTL). A cart spends its principal's mutation budget one
// unit per line (CartRequest.RateLimit), so what carts leave in Redis is
// bounded by the budget as a reserve's is.
// A HELD cart stays in cartpending, due at its expiry, when the sweep
// releases any line still held: ExtendCart extends every line and only then
// moves the cart's expiry (extend_cart.lua), so an extension cut short ends
// with the cart's old expiry. A cart's status is read from its lines; a line is committed or cancelled
// only with its cart (CommitCart: begin_commit on every line, one Postgres
// transaction for all, finish_commit on each).
//
// # The scripts' contract
//
// Each script opens with its KEYS in a fixed order, its ARGV, its replies and
// why it is one script, and package script has one typed function per
// script (script.RunExtendHold, with script.ExtendHold as its arguments and
// script.Hold as its reply, ...) that lays out its KEYS and ARGV in that
// order; a test checks each against its script's header.
// Every key the caller can name is passed in KEYS, all of one partition and
// so of one hash tag and one Cluster slot. A script derives a key from the
// partition base only from data it has just read, through lib.lua's hold_key,
// idem_key, sku_keys, wait_keys and drop_key, and says so in its header;
// reserve.lua alone also derives each request's hold and idempotency record
// from the token and hash its arguments carry (every argument of a batch
// costs Redis about as much to read as a small command does).
// These do: reserve.lua (the hold an idempotency record names, and for a SKU
// of a drop the drop's hash and its SKUs' stock and quota hashes, which
// may_take reads for every path: hold_cart_lines.lua, join_waitlist.lua and
// every handoff read them too), begin_commit.lua,
// release_hold.lua and extend_hold.lua (the stock hash, quota hash and
// channel of the SKU of a hold the caller knows by token only, and for
// release_hold.lua its waitlist), hydrate_sku.lua (the hash and idempotency
// record of each hold of a chunk: thousands per call), and every script
// that hands units to waiters (release_hold.lua, begin_commit.lua,
// finish_commit.lua, reconcile_hold.lua, apply_product.lua, publish_sku.lua,
// join_waitlist.lua: the hash of each
// hold it makes, from a token it makes), and apply_draw.lua (the hash of each
// winner's hold, from the token the ledger gave it).
//
// # Who may take a unit
//
// Package policy says which sale modes admit which path (a reserve, a cart
// line, a waitlist offer, a draw's result, a waitlist join, and an admission
// pass to come) and which limits each path is held to; lua/lua.go renders
// its tables into the scripts' library, and lib.lua's may_take, which every
// script that hands units out calls before its first write (reserve.lua,
// hold_cart_lines.lua, handoff, apply_draw.lua) and join_waitlist.lua,
// decides with them. A SKU's mode is its stock hash's 'mode' (first_come or
// draw), written by every rebuild from the ledger (products.draw).
//
// # Draws
//
// A product created with a draw (inventory/draw) has the mode draw, which
// admits only a draw's result and waitlist offers: a reserve, a cart line
// and a join are refused (DRAW_ONLY). Its entries live in Postgres only; the
// draw is decided there (db.Draws.RunDraw, the shuffle in
// draw/draw_shuffle.go, for the units neither sold nor held) and carried to
// Redis by apply_draw.lua in batches, every winner in draw order and then
// the losers in draw order: a winner's HELD hold (a reserve event, like any
// other), a loser's waitlist entry (a wjoin event). The progress hash makes
// each batch apply once. A winner may_take refuses (the units the draw
// counted were not there) is recorded in the progress hash and put in the
// waitlist, ahead of the losers; RunDraw then records it in the ledger
// (draw_results.unheld), logs and counts it, writes every winner's hold to
// the ledger, and only then marks the draw applied.
//
// # Waitlist
//
//	join --> WAITING --units freed, its turn--> OFFERED (a HELD reservation)
//	            \--leave--> LEFT (the entry is deleted)
//
// Units a cancel, an expiry (by the sweeper or by a late commit), a commit
// the ledger refuses, a release by the reconciler, a restock or a rebuild
// makes available go to
// the SKU's waiters in seq order, in the same script (handoff in
// lua/lib.lua): a waiter whose quantity fits and whose quota allows is
// handed a hold of its chosen length, the others are passed over. What no
// waiter can take stays available. The tokens of those holds are derived
// from a random nonce the caller passes (offer_token), so they are as
// unguessable as newToken's and a script run twice makes the same ones (and,
// having released nothing the second time, none). Seqs only grow: a rebuild
// sets the next above its generation. Joins, leaves and offers are outbox
// events (wjoin, wleave, woffer) applied to waitlist_entries, and a rebuild
// stages the queue from there (stage_waitlist.lua) for publish_sku.lua.
//
// Reserves are group-committed (reserveBatcher): the reserves of one
// partition that arrive while two of its batches are on their way wait, and
// go to Redis together as one run of reserve.lua, which decides each request
// in turn, every check of a request before its own writes and after the
// writes of the requests before it. The answers are those of the same
// reserves run one after the other; Redis pays one script call per batch,
// reads and writes each SKU's stock hash once per batch (the requests check
// and deduct on the run's copy of its counters), and announces each SKU once
// per batch. A quiet partition's reserve is a batch of
// one, sent at once. Batches go through the client's autopipeliner (go-redis
// AutoPipeline), so the batches of different partitions travel to Redis in
// one write and their replies come back in one read. A reserve whose caller
// gives up while it waits in the queue is left out of its batch; once its
// batch has left, the caller's context no longer cuts it short (the batch has
// its own), and a batch retried after a broken connection may run twice, which replays the
// same holds: each token is its caller's and the script finds its own hold
// first. With WaitReplicas set, a batch goes in a pipeline of its own with
// its WAIT instead (runReplicated), since WAIT must follow the write on its
// connection.
//
// A reserve spends its principal's mutation budget (RateLimit, GCRA as
// lib.lua's rate_check computes it) in the same run of reserve.lua, before
// anything else of the request, so that with a single Redis a reserve is one
// script run and not two. Where that cannot be (a cluster, whose budget keys
// live in their own slots; a reserve with an idempotency key, whose claim
// must not be made for a refused request; an input refused before any
// script) it is spent first by rate_limit.lua, as every other mutation's.
//
// Replies are decoded in one place, package script: each reply shape has
// one decoder there (a hold_reply, begin_commit's attempt, reserve's
// rejections, ...), and replies.go turns the typed replies into the
// engine's types. Every code a script can answer is a business outcome of
// package outcome or a protocol code of replies.go. A hold, whether a
// script returned it or its hash was read, becomes a Reservation through
// storedHold.reservation; holdFromLedger is the same for a ledger row.
//
// # Why it cannot oversell
//
// Every change is one Lua script, and Redis runs a script to completion before
// any other command. reserve.lua checks the sale window, the quota and the
// stock and then deducts, with no write before the last check: there is no
// moment at which two buyers can both see the last unit. Postgres backs this
// up: products.sold rises only with a sale row, under CHECK (sold <= total).
//
// # Why a commit happens exactly once
//
// begin_commit.lua moves the hold from HELD to COMMITTING and out of the
// expiry index in one step, so the sweeper cannot release units that are being
// sold. The sale is then written to Postgres, keyed by the token (a repeated
// write finds the first row). finish_commit.lua then marks the hold COMMITTED
// and moves its units from held to sold. Concurrent commits of one token all
// reach the same sale row and all answer OK.
//
// Each attempt stamps the hold with its own id (cst), which the caller
// chooses and sends with every try of its begin_commit call: a call the Redis
// client repeats after a lost reply finds its own id and answers as the first
// time, so it is the same attempt, not one that joined. If Postgres could not be
// reached and nothing was sent, the attempt that moved the hold out of HELD
// puts it back, with its original expiry, but only while its id is still on
// the hold: an attempt that joined since may be writing the sale, and a
// failed attempt must never undo its protection. If the outcome is unknown (a
// timeout mid-write), or another attempt joined, the hold stays COMMITTING: a
// cancel answers UNAVAILABLE (retry), and ReconcileCommits settles it by
// asking Postgres once the latest attempt is older than any write can take
// (releasing it instead when the ledger has it as cancelled or expired).
//
// The ledger never sells a reservation it has as CANCELLED or EXPIRED
// (db.Sales.RecordSale refuses with db.ErrEnded): such a commit is answered
// ErrAlreadyCancelled or ErrExpired, and Redis releases the hold with the
// ledger's status. Nor does it sell one it still has as HELD that a rebuild
// recorded as expired in Redis (the rebuild marks the row before the SKU
// goes live, db.Snapshot.Seal; the expiry itself comes through the
// outbox): a commit begun before the rebuild and written after is answered
// ErrExpired, and the unit stays with the buyer the rebuild gave it to. The sale row records the hold's idempotency hash and
// fingerprint, so the key replays the sale after Redis loss even when the
// reserve event never reached Postgres.
//
// # Extending a hold
//
// extend_hold.lua gives a HELD hold a new expiry (now + the time asked for),
// at most MaxExtensions times and never past MaxHold after its creation. It
// refuses a hold whose expiry has passed, and release_hold.lua expires only a
// hold whose expiry has passed, both reading Redis' clock inside the script:
// of an extension and an expiry racing, exactly one happens. It re-scores the
// hold in the expiry index and appends an 'extend' event whose id names the
// extension's number, so the ledger records each once; the ledger keeps the
// expiry of the event with the most extensions, and a rebuild restores the
// hold with it and with its count. Extend also writes the event to the ledger
// before answering, best effort (as a cancel does), so an extension survives
// Redis losing its data unless that write failed too. Each call carries its
// own id (xid), so a script the Redis client sends twice extends once. A
// client's retry is another call: with an idempotency key, extend_hold.lua
// records the key's hash on the hold (x:<hash> = the hold time asked for)
// in the same step as the extension, and answers a later call with the same
// key and hold time with the hold as it is (another hold time:
// IDEMPOTENCY_KEY_REUSED). The key is claimed, as a reserve's is, for
// "#extend:" and the hold's or cart's token, so using it for anything else
// is refused too. ExtendCart sends the key with every line.
//
// # Drops
//
// A drop groups SKUs under one per-person limit and one sale window, checked
// by reserve.lua next to the SKU's own. The drop's count is the sum of the
// buyer's entries in the quota hashes of the drop's SKUs, so it is always
// what the SKUs say, through releases, sales and rebuilds alike; a SKU of
// the drop Redis lacks is rebuilt before the sum is trusted. For that sum to
// be one script on Redis Cluster, a drop's SKUs live in the drop's
// partition. Keys.PartitionOf is the one place that says where a SKU lives;
// the ledger is where it is written (products.drop_id, fixed at creation).
// The engine places any SKU whose product row, hold or outbox event it
// reads; a SKU it has not heard of is looked for in its own
// partition, where nothing of it exists, so the caller rebuilds it, and
// Rebuild reads the SKU's drop from the ledger before anything else, places
// it and writes the drop's hash (apply_drop.lua, under the drop's version,
// which rises as each SKU joins) before the SKU goes live.
//
// # Idempotency
//
// A reserve with an idempotency key records its first outcome (a hold or a
// rejection) under a hash of (principal, key): a hold for IdempotencyTTL (24
// hours), a rejection for RejectionTTL (5 minutes); a repeat with the same
// request replays it, one with a different request gets
// ErrIdempotencyKeyReused. Rejections are short-lived because a client can
// provoke them at will, each with a fresh key: what one principal can make
// Redis keep is bounded by its mutation rate times RejectionTTL (about 530
// bytes per rejection, record and claim), not by a day of requests.
//
// The record lives in the SKU's partition, so it is checked inside
// reserve.lua; a one-line claim (claim_idempotency_key.lua) pins the key to
// its first SKU so that reuse with another SKU is refused too. The claim is
// set for RejectionTTL and extended to IdempotencyTTL once the key gets a
// hold. Every script is also safe to run twice with the same arguments: a
// reserve retried by the Redis client after a lost reply finds its own hold
// by token.
//
// Redis can lose the claims with the rest of its data. Each partition of
// claims has a marker (idemclaims) without a TTL, in the same hash tag, so it
// is lost exactly when they are. When the claim script finds it missing, the
// engine sets it to the ledger's newest use of any idempotency key within the
// TTL, plus the TTL (0 on a ledger without one, as on a fresh deployment):
// past that time no key the ledger knows can still be live. Every other
// partition whose marker is missing gets the same value then, so that a
// partition whose first claim comes later is not marked from keys the ledger
// took meanwhile, whose claims are in Redis. Until then, a
// claim that looks new is checked against the ledger (one indexed lookup by
// the key's hash) and pinned to the SKU the ledger has; afterwards the
// reserve path never touches Postgres. Left open: a key whose only reserve
// was lost with Redis (its event never reached Postgres) is unknown to both,
// and reusing it with another SKU is accepted; if Postgres cannot answer the
// check, the claim is taken as new.
//
// # Read-repair
//
// When a script finds its SKU missing it answers NEEDS_HYDRATION, and Rebuild
// reloads the SKU from Postgres under the product's row lock (so no sale can
// commit between the read and the write) before the call is retried. Postgres
// knows every sale and every hold the write-behind worker has recorded, and
// the rebuild first applies the events of the SKU still in its partition's
// outbox, when Redis kept it (the SKU's hash alone was dropped, as a reload
// after a promotion does); holds made in the last moments before Redis lost
// its data with its outbox are lost with it, and their units return to stock. Restored holds are admitted oldest first
// while they fit in total - sold; any that do not fit are recorded as expired.
// Finished reservations of the last 24 hours are restored with their
// idempotency keys, so a key replays what it did; a rejection is not in
// Postgres, so a rejected key is a new request after Redis lost it.
//
// A SKU may have hundreds of thousands of reservations in the rebuild's
// windows, more than one script should take (Redis runs nothing else while a
// script runs), so the rebuild is written in steps, all under the lock:
//
//	stage_rebuild.lua  the SKU is absent: pick a new generation, stage it in rebuild:<sku>
//	hydrate_sku.lua    one chunk of RebuildBatch (1,000) reservations and quota counts,
//	                   numbered; refused unless its generation is the staged one and its
//	                   number the next; a retried chunk is written once
//	publish_sku.lua    every chunk written: rename the staged quota hash onto quota:<sku>
//	                   and write the stock hash with the generation, in one step
//
// Until the publish, every script and read finds no SKU and waits for the
// rebuild, and the holds already written do not count (their generation is
// not the SKU's yet): a reader sees no SKU or all of it. The row lock keeps
// rebuilds of a SKU one at a time; a rebuild that lost its lock (its
// connection died) and goes on writing is refused as soon as another has
// staged, and what it wrote before is of no generation the SKU ever has:
// its holds expire (a restored hold lives at most its expiry plus the
// retention), its staged keys after ten minutes. Postgres streams the
// snapshot in batches from one statement, so memory is a batch, and the next
// chunk is read while the previous one is written.
//
// 200,000 reservations (120,000 live holds) rebuild in 5.5 s through the
// real binary (11-21 s with the race detector) on a loaded 2-core machine,
// in 242 scripts of at most 52 ms each (a chunk costs Redis about 16 ms when
// measured alone); Postgres sends the first rows after 0.7 s
// (docs/reliability.md).
//
// A rebuild reads the ledger, and the write-behind may still hold events of
// the SKU's earlier life that it read from the outbox before Redis lost its
// data: a cancel, an expiry, a reserve. A batch waits for a rebuild's row
// lock, so it lands either before the snapshot (which then has it) or after
// the new generation is in Redis. After writing a batch, and before
// acknowledging it, the write-behind calls ReconcileApplied: for every event
// whose generation is no longer its SKU's, reconcile_hold.lua is told what
// the ledger now says of the hold. A hold the ledger has as cancelled or
// expired that the rebuild restored as HELD is released (so it can be neither
// sold nor released a second time); a hold the ledger has as HELD that the
// rebuild did not know is adopted as HELD in the new generation if it is not
// due and the stock, the quota and its idempotency key allow, and otherwise
// recorded as EXPIRED, in Redis and, through its event, in the ledger. A
// commit, cancel or read that finds a hold missing from a loaded SKU while the
// ledger has it as HELD does the same at once. A HELD row a rebuild marked
// dropped (the ledger refuses its sale) is never adopted: it is recorded as
// EXPIRED again, or released as such if Redis has it as HELD, as a later
// rebuild drops it again; the commit reconciler likewise releases a
// half-done commit of one as expired rather than putting it back to HELD. As a last net, the commit
// reconciler looks at holds the ledger has as HELD well past their expiry
// (CloseOverdueHolds): one Redis does not have in its SKU's generation is
// closed as EXPIRED, and one Redis has ended there (its ending's event never
// reached the ledger) is recorded in the ledger as Redis ended it; in both
// cases the pass writes the ending to the ledger itself. A hold Redis has as
// HELD or being committed is never touched. The ledger itself records at most
// one release per hold (db.Ledger.ApplyEvents).
//
// Cancel writes its ledger row right after the release in Redis, before it
// answers (best effort, within 500 ms; the outbox event stays the
// guarantee). This costs one Postgres transaction per cancel, which is
// rare next to reserves, and narrows the window in which a rebuild can
// restore a cancelled hold to the moments when Postgres is slow or down:
// a buyer who acts on the cancel (or takes the freed unit) finds it in the
// ledger. The repair above covers the rest: reserves, expiries, and cancels
// whose write failed. Expiries are not written synchronously: the sweeper
// releases thousands at once and the write-behind batches them.
//
// # Failure modes
//
//   - Redis down: reserves, cancels and commits fail with ErrUnavailable.
//   - Postgres down: reserves and cancels go on (Redis only; the outbox grows),
//     commits fail with ErrUnavailable and keep their holds (HELD again, so
//     they can be cancelled and expire on time).
//   - Redis restored from an older snapshot or a lagging replica: a commit
//     Redis calls expired or cancelled is checked against Postgres' sales and
//     answered as committed when the sale is there. Counters of such a Redis
//     are not compared with the ledger; run Redis without persistence (every
//     restart rebuilds from Postgres) or with AOF fsync always.
//   - Redis failover with asynchronous replication can lose the last holds
//     written to the old primary; commits are safe because Postgres is first.
//   - A product change (restock, update) committed in Postgres whose Redis
//     step failed: the call answers ErrUnavailable, products.redis_version
//     stays below version, and ReapplyProducts (run by the commit
//     reconciler) applies it later, version-guarded; until then Redis keeps
//     the old total, limit or window.
//   - Redis must run with maxmemory-policy noeviction: an evicted hold or
//     counter would be state silently lost.
//   - Redis lost its data while events were on their way to Postgres: holds
//     whose reserve event had not been read yet are lost (their units return
//     to stock, a commit answers NOT_FOUND); events the write-behind had read
//     are written after the rebuild and Redis is told (see Read-repair). A
//     commit of such a hold that arrives before its event has landed is
//     answered NOT_FOUND, and the hold may still be adopted when the event
//     lands: it is then live again and expires on time. A cancel whose ledger
//     write failed and whose event is lost with Redis is undone by the
//     rebuild: the hold is HELD again and expires. If a rebuilt hold is sold
//     before its earlier life's cancel lands (both the synchronous write and
//     the event late), the sale stands and the ledger records no release.
package inventory
