package script

import (
	"fmt"
	"hash/crc32"
	"sync"
)

// Partitions is the number of hash-tag partitions the keyspace is cut into. A
// SKU lives in one partition for its whole life, so this number is fixed for a
// deployment: changing it would move SKUs away from their holds and streams.
const Partitions = 16

// Keys builds every Redis key Dropline uses. Each key carries its partition's
// hash tag, e.g. "dl:{p07}:sku:DROP-1", so all keys one script touches hash to
// one Redis Cluster slot.
type Keys struct {
	prefix string
	bases  *[Partitions]string // prefix + "{pNN}:", formatted once
	// placed holds the partition of each SKU that does not live in its own
	// (PartitionOf): the SKUs of a drop live in the drop's. Shared by every
	// copy of this Keys; see Placement.
	placed *sync.Map
}

// NewKeys returns the key builder for a prefix such as "dl:". The prefix must
// not contain braces: the first {...} in a key is its hash tag.
func NewKeys(prefix string) Keys {
	k := Keys{prefix: prefix, bases: new([Partitions]string), placed: new(sync.Map)}
	for p := range k.bases {
		k.bases[p] = fmt.Sprintf("%s{p%02d}:", prefix, p)
	}
	return k
}

// PartitionOf returns the partition of a SKU of its own, in no drop:
// crc32(sku) % 16. Keys.PartitionOf is where a SKU's keys really live.
func PartitionOf(sku string) int {
	return int(crc32.ChecksumIEEE([]byte(sku)) % Partitions)
}

// DropPartition is the partition of a drop, and of every SKU in it.
func DropPartition(drop string) int { return PartitionOf(drop) }

// PartitionOf returns the partition a SKU's keys live in: its drop's when
// this Keys has been told of it (place), else its own. A SKU's partition is
// fixed when it is created, so what is placed is never wrong later. A SKU
// not yet placed here (another instance created it in a drop a moment ago)
// is looked for in its own partition and found missing there: every path
// then rebuilds it from the ledger, which places it first (see Drops in
// package inventory), so no key of it is ever written in the wrong partition.
func (k Keys) PartitionOf(sku string) int {
	if p, ok := k.placed.Load(sku); ok {
		return p.(int)
	}
	return PartitionOf(sku)
}

// PlaceAt records that sku lives in partition p, as an event of p's outbox
// or a token of p says: a hold is always made in its SKU's partition.
func (k Keys) PlaceAt(sku string, p int) {
	if p != PartitionOf(sku) {
		k.placed.Store(sku, p)
	}
}

// Drop is the hash of a drop as reserve.lua reads it (max start end ver skus),
// in the drop's partition.
func (k Keys) Drop(drop string) string { return k.Base(DropPartition(drop)) + "drop:" + drop }

// Base is the common start of every key of partition p: prefix + "{pNN}:".
// A script receives it only to derive keys from data it has just read (the
// hold an idempotency record names, the SKU of a hold known by token, the
// holds of a rebuild chunk, the drop a SKU's hash names and the drop's
// SKUs); lib.lua's hold_key, idem_key, sku_keys and drop_key build them
// exactly as the methods here do.
func (k Keys) Base(p int) string {
	return k.bases[p]
}

// SKU is the stock hash of a SKU.
func (k Keys) SKU(sku string) string { return k.skuIn(k.PartitionOf(sku), sku) }

func (k Keys) skuIn(p int, sku string) string { return k.Base(p) + "sku:" + sku }

// Hold is the hash of one hold; the token names its partition.
func (k Keys) Hold(p int, token string) string { return k.Base(p) + "hold:" + token }

// Quota is the hash of a SKU's per-principal quota counts (field: principal,
// value: units held or bought). One hash per SKU, so a rebuild replaces every
// count of the SKU at once and no count outlives the life it was made in.
func (k Keys) Quota(sku string) string { return k.quotaIn(k.PartitionOf(sku), sku) }

func (k Keys) quotaIn(p int, sku string) string { return k.Base(p) + "quota:" + sku }

// Staged is the keys a SKU's rebuild writes beside the live ones, which the
// publish step renames onto them (see Rebuild in inventory/doc.go).
type Staged struct{ k Keys }

// Staged returns the rebuild's staging keys.
func (k Keys) Staged() Staged { return Staged{k} }

// Rebuild is the hash of a SKU's rebuild under way (gen: its generation,
// next: the chunks written), checked by every chunk and by the publish step.
func (s Staged) Rebuild(sku string) string { return s.k.Base(s.k.PartitionOf(sku)) + "rebuild:" + sku }

// Quota is the quota hash a rebuild stages; publishing renames it onto
// Keys.Quota.
func (s Staged) Quota(sku string) string { return s.Rebuild(sku) + ":quota" }

// WaitQueue and WaitEntries are the waitlist a rebuild stages; publishing
// renames them onto Keys.WaitQueue and Keys.WaitEntries.
func (s Staged) WaitQueue(sku string) string { return s.Rebuild(sku) + ":wait" }

// WaitEntries is the entries hash a rebuild stages (see WaitQueue).
func (s Staged) WaitEntries(sku string) string { return s.Rebuild(sku) + ":waiters" }

// Idempotency is the record of a reserve's first outcome, in the SKU's partition.
func (k Keys) Idempotency(sku, idemHash string) string {
	return k.idempotencyIn(k.PartitionOf(sku), idemHash)
}

func (k Keys) idempotencyIn(p int, idemHash string) string { return k.Base(p) + "idem:" + idemHash }

// IdempotencyClaim pins an idempotency key to the SKU it was first used with,
// so reusing it for another SKU (another partition) is detected. It lives in
// the partition of the key's own hash.
func (k Keys) IdempotencyClaim(idemHash string) string {
	return k.Base(int(crc32.ChecksumIEEE([]byte(idemHash))%Partitions)) + "idemclaim:" + idemHash
}

// idempotencyClaims marks, in the partition of the claim of idemHash, since
// when Redis has kept that partition's claims (ms). It has no TTL, so it is
// lost exactly when the claims are: its absence or youth tells a claim that
// looks new that an earlier one may have been lost.
func (k Keys) idempotencyClaims(idemHash string) string {
	return k.IdempotencyClaimsIn(int(crc32.ChecksumIEEE([]byte(idemHash)) % Partitions))
}

// IdempotencyClaimsIn is partition p's marker of claims (idempotencyClaims).
func (k Keys) IdempotencyClaimsIn(p int) string { return k.Base(p) + "idemclaims" }

// Layout is the hash recording the layout of the data under this prefix
// (layout, compat: see inventory.LayoutVersion), in partition 0. Every
// engine reads it at start.
func (k Keys) Layout() string { return k.Base(0) + "layout" }

// Expiry is the partition's sorted set of HELD tokens by expiry (ms).
func (k Keys) Expiry(p int) string { return k.Base(p) + "expiry" }

// Committing is the partition's sorted set of COMMITTING tokens by start (ms),
// which the commit reconciler walks after a crash.
func (k Keys) Committing(p int) string { return k.Base(p) + "committing" }

// Outbox is the partition's event stream, read by the write-behind worker.
func (k Keys) Outbox(p int) string { return k.Base(p) + "outbox" }

// DeadLetters is partition p's dead-letter stream: outbox entries the
// write-behind could not apply (undecodable, of an unknown kind, or refused
// by Postgres too often), kept with their fields for an operator. It shares
// the outbox's hash tag, so an entry is moved there and acknowledged in one
// MULTI.
func (k Keys) DeadLetters(p int) string { return k.Outbox(p) + ":dead" }

// Channel is the sharded pub/sub channel announcing a SKU's stock.
func (k Keys) Channel(sku string) string { return k.channelIn(k.PartitionOf(sku), sku) }

func (k Keys) channelIn(p int, sku string) string { return k.Base(p) + "avail:" + sku }

// Cart is the hash of one cart (who st ctd dl exp lines idem fp rej), in its
// home partition; the cart's token names that partition.
func (k Keys) Cart(p int, token string) string { return k.Base(p) + "cart:" + token }

// cartIdempotency is the record of a cart's first outcome for an
// idempotency hash, in the partition of the hash (the cart's home).
func (k Keys) cartIdempotency(p int, idemHash string) string {
	return k.Base(p) + "cartidem:" + idemHash
}

// CartsPending is partition p's sorted set of PENDING carts by deadline (ms),
// which the cart sweep walks to let go of carts whose caller died mid-way.
func (k Keys) CartsPending(p int) string { return k.Base(p) + "cartpending" }

// The KEYS of each script, in the order its header in lua/ gives. A script
// is passed every key its caller can name; all of them are in one partition,
// so they share one hash tag and one Redis Cluster slot. The hold-scoped
// builders take the partition from the hold's token and build the SKU's keys
// in that partition, as the scripts did when they derived them: a token is
// always made in its SKU's partition.

// reserveBudgetKey is one request's key in reserve.lua's KEYS: the budget
// at budgetKey it spends, or, when the run does not spend one ("" here), a
// placeholder of partition p that is never touched.
func (k Keys) reserveBudgetKey(p int, budgetKey string) string {
	if budgetKey == "" {
		return k.Base(p) + "nobudget"
	}
	return budgetKey
}

// tokenHoldKeys is the KEYS of begin_commit.lua and release_hold.lua, whose
// callers know a hold by its token only.
func (k Keys) tokenHoldKeys(p int, token string) []string {
	return []string{k.Hold(p, token), k.Expiry(p), k.Committing(p), k.Outbox(p)}
}

// extendHoldKeys is extend_hold.lua's KEYS; its caller knows the hold by
// token only.
func (k Keys) extendHoldKeys(p int, token string) []string {
	return []string{k.Hold(p, token), k.Expiry(p), k.Outbox(p)}
}

// finishCommitKeys is finish_commit.lua's KEYS.
func (k Keys) finishCommitKeys(p int, token, sku string) []string {
	return []string{k.Hold(p, token), k.skuIn(p, sku), k.quotaIn(p, sku), k.Expiry(p), k.Committing(p),
		k.Outbox(p), k.channelIn(p, sku), k.waitQueueIn(p, sku), k.waitEntriesIn(p, sku)}
}

// reconcileHoldKeys is reconcile_hold.lua's KEYS.
func (k Keys) reconcileHoldKeys(p int, token, sku, idemHash string) []string {
	return append(k.finishCommitKeys(p, token, sku), k.idempotencyIn(p, idemHash))
}

// applyProductKeys is apply_product.lua's KEYS.
func (k Keys) applyProductKeys(sku string) []string {
	p := k.PartitionOf(sku)
	return []string{k.SKU(sku), k.Channel(sku), k.Quota(sku), k.Expiry(p), k.Outbox(p), k.WaitQueue(sku), k.WaitEntries(sku)}
}

// WaitQueue is the sorted set of a SKU's WAITING principals by their
// entry's seq: the order in which freed units are handed over.
func (k Keys) WaitQueue(sku string) string { return k.waitQueueIn(k.PartitionOf(sku), sku) }

func (k Keys) waitQueueIn(p int, sku string) string { return k.Base(p) + "wait:" + sku }

// WaitEntries is the hash of a SKU's waitlist entries by principal (and
// '#seq', the last seq handed out); lib.lua's wait_keys builds both names
// the same way.
func (k Keys) WaitEntries(sku string) string { return k.waitEntriesIn(k.PartitionOf(sku), sku) }

func (k Keys) waitEntriesIn(p int, sku string) string { return k.Base(p) + "waiters:" + sku }

// waitlistKeys is join_waitlist.lua's and leave_waitlist.lua's KEYS.
func (k Keys) waitlistKeys(sku string) []string {
	p := k.PartitionOf(sku)
	return []string{k.SKU(sku), k.Quota(sku), k.WaitQueue(sku), k.WaitEntries(sku), k.Expiry(p), k.Outbox(p), k.Channel(sku)}
}

// Walks is the sorted set of a partition's SKUs whose waitlist walk is
// unfinished, by when it was left (ms); lib.lua's walks_key builds the same
// name. The walk sweep continues each (ContinueWalks).
func (k Keys) Walks(p int) string { return k.Base(p) + "walks" }

// continueWalkKeys is continue_walk.lua's KEYS, for a SKU of partition p.
func (k Keys) continueWalkKeys(p int, sku string) []string {
	return []string{k.skuIn(p, sku), k.quotaIn(p, sku), k.waitQueueIn(p, sku), k.waitEntriesIn(p, sku), k.Expiry(p),
		k.Outbox(p), k.channelIn(p, sku), k.Walks(p)}
}

// DrawProgress is the hash of a draw's progress into Redis: 'done', the
// entries apply_draw.lua has written.
func (k Keys) DrawProgress(sku string) string { return k.Base(k.PartitionOf(sku)) + "draw:" + sku }

// DrawChannel is the sharded pub/sub channel that says a SKU's draw has
// been carried to Redis in full (its result applied): one message per draw,
// in the SKU's partition, so the partition's pub/sub connection carries it
// with the SKU's stock.
func (k Keys) DrawChannel(sku string) string { return k.Base(k.PartitionOf(sku)) + "drawn:" + sku }

// applyDrawKeys is apply_draw.lua's KEYS.
func (k Keys) applyDrawKeys(sku string) []string {
	p := k.PartitionOf(sku)
	return []string{k.SKU(sku), k.Quota(sku), k.Expiry(p), k.Outbox(p), k.Channel(sku), k.WaitQueue(sku), k.WaitEntries(sku),
		k.DrawProgress(sku)}
}

// stageWaitlistKeys is stage_waitlist.lua's KEYS.
func (k Keys) stageWaitlistKeys(sku string) []string {
	st := k.Staged()
	return []string{k.SKU(sku), st.Rebuild(sku), st.WaitQueue(sku), st.WaitEntries(sku)}
}

// stageRebuildKeys is stage_rebuild.lua's KEYS.
func (k Keys) stageRebuildKeys(sku string) []string {
	return []string{k.SKU(sku), k.Staged().Rebuild(sku), k.Staged().Quota(sku)}
}

// hydrateKeys is hydrate_sku.lua's KEYS.
func (k Keys) hydrateKeys(sku string) []string {
	p := k.PartitionOf(sku)
	return append(k.stageRebuildKeys(sku), k.Expiry(p), k.Outbox(p))
}

// publishKeys is publish_sku.lua's KEYS.
func (k Keys) publishKeys(sku string) []string {
	p := k.PartitionOf(sku)
	return append(k.stageRebuildKeys(sku), k.Quota(sku), k.Channel(sku), k.Staged().WaitQueue(sku), k.Staged().WaitEntries(sku),
		k.WaitQueue(sku), k.WaitEntries(sku), k.Expiry(p), k.Outbox(p))
}

// dueHoldsKeys is due_holds.lua's KEYS.
func (k Keys) dueHoldsKeys(p int) []string { return []string{k.Expiry(p)} }

// claimKeys is claim_idempotency_key.lua's KEYS.
func (k Keys) claimKeys(idemHash string) []string {
	return []string{k.IdempotencyClaim(idemHash), k.idempotencyClaims(idemHash)}
}

// cartKeys is the KEYS of open_cart.lua and finish_cart.lua.
func (k Keys) cartKeys(p int, token, idemHash string) []string {
	return []string{k.Cart(p, token), k.cartIdempotency(p, idemHash), k.CartsPending(p)}
}

// abandonCartKeys is abandon_cart.lua's and extend_cart.lua's KEYS.
func (k Keys) abandonCartKeys(p int, token string) []string {
	return []string{k.Cart(p, token), k.CartsPending(p)}
}

// holdCartLinesKeys is hold_cart_lines.lua's KEYS for lines of partition p.
func (k Keys) holdCartLinesKeys(p int, lines []CartLine) []string {
	keys := make([]string, 0, 1+4*len(lines))
	keys = append(keys, k.Expiry(p))
	for _, l := range lines {
		keys = append(keys, k.skuIn(p, l.SKU), k.Hold(p, l.Token), k.quotaIn(p, l.SKU), k.channelIn(p, l.SKU))
	}
	return keys
}

// confirmCartLinesKeys is confirm_cart_lines.lua's KEYS for lines of partition p.
func (k Keys) confirmCartLinesKeys(p int, lines []CartLine) []string {
	keys := make([]string, 0, 2+2*len(lines))
	keys = append(keys, k.Expiry(p), k.Outbox(p))
	for _, l := range lines {
		keys = append(keys, k.skuIn(p, l.SKU), k.Hold(p, l.Token))
	}
	return keys
}
