package worker

import "github.com/dropline/dropline/inventory"

// keys builds the worker group's own Redis keys. They sit next to the engine's
// keys (inventory.Keys) and carry the same partition hash tag, e.g.
// "dl:{p07}:lease:sweeper", so a lease and its fencing counter share one Redis
// Cluster slot and one script can touch both.
type keys struct {
	inv inventory.Keys
}

func newKeys(inv inventory.Keys) keys { return keys{inv: inv} }

// lease is the key whose value is the owner token of partition p's lease of
// one worker kind: <prefix>{pNN}:lease:<kind>.
func (k keys) lease(p int, kind string) string { return k.inv.Base(p) + "lease:" + kind }

// fence counts the acquisitions of a lease; each acquisition's value is the
// fencing token Postgres checks: <prefix>{pNN}:lease:<kind>:fence.
func (k keys) fence(p int, kind string) string { return k.lease(p, kind) + ":fence" }

// members is the sorted set of live processes running a worker kind, scored by
// when their membership lapses; it decides each process's fair share of
// partitions. It lives in partition 0.
func (k keys) members(kind string) string { return k.inv.Base(0) + "members:" + kind }

// epoch is a random value set once per partition while Redis keeps its data.
// Its disappearance means the partition's Redis lost everything (flush,
// restart without persistence, failover to an empty replica).
func (k keys) epoch(p int) string { return k.inv.Base(p) + "epoch" }

// primary records the replication id of the Redis primary the SKUs were
// last reloaded for: in partition 0 for a single primary (or Sentinel's),
// which serves every partition; in each partition on a cluster, whose
// shards have an id each. A new id under the same data means a replica was
// promoted, or the primary restarted from its persistence files: writes of
// the last moments before may be missing while everything else is there.
func (k keys) primary(p int) string { return k.inv.Base(p) + "primary" }

// reloadClaim names the process reloading the SKUs recorded in partition p
// for the primary of replication id, with an expiry its owner renews as it
// goes.
func (k keys) reloadClaim(p int, id string) string { return k.primary(p) + ":reload:" + id }

// reloaded lists the SKUs reloaded for the primary of replication id
// (recorded in partition p), so a process that takes over a dead one's
// reload does not reload them again.
func (k keys) reloaded(p int, id string) string { return k.primary(p) + ":reloaded:" + id }
