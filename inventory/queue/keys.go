package queue

import (
	"strings"

	"github.com/dropline/dropline/inventory"
)

// Kind is what a queue stands in front of.
type Kind string

// The kinds of queue.
const (
	// OfProduct is the queue of one product (never a product of a drop).
	OfProduct Kind = "sku"
	// OfDrop is the queue of a drop: one pass buys any of its SKUs.
	OfDrop Kind = "drop"
)

// Ref names a queue: the product or the drop it stands in front of.
type Ref struct {
	Kind Kind
	ID   string
}

// String is the queue's id, as the ledger and the Redis keys name it:
// "sku:<sku>" or "drop:<drop>" (lib.lua's queue_scope).
func (r Ref) String() string { return string(r.Kind) + ":" + r.ID }

// keys are the Redis keys of one queue, all in the partition of its product
// or drop, so every script of a queue runs in one Redis Cluster slot, with
// the product's (or drop's SKUs') stock hashes:
//
//	dl:{p07}:q:<queue>      hash   opens rate pass_ms state pre next numbered through credit last status seq
//	dl:{p07}:qpre:<queue>   set    principals in the pre-queue (until it is numbered)
//	dl:{p07}:qwho:<queue>   hash   principal -> ticket number (0: in the pre-queue)
//	dl:{p07}:qnum:<queue>   hash   ticket number -> principal
//	dl:{p07}:qpass:<queue>  hash   principal -> "pass|expires_ms|state|number" (A: unspent, U: spent)
//	dl:{p07}:qlive:<queue>  zset   principals with an unspent pass, by its expiry (ms)
//	dl:{p07}:outbox         stream the partition's outbox: joins, numberings, admissions, spent passes
type keys struct {
	base                             string
	queue, pre, who, num, pass, live string
	stock                            string // the product's stock hash, or the drop's hash
	outbox                           string // the partition's event stream
	id                               string // the queue's id (Ref.String)
	partition                        int
}

func keysOf(k inventory.Keys, r Ref) keys {
	p := inventory.PartitionOf(r.ID)
	stock := k.SKU(r.ID)
	if r.Kind == OfDrop {
		p = inventory.DropPartition(r.ID)
		stock = k.Drop(r.ID)
	}
	b := k.Base(p)
	id := r.String()
	return keys{base: b, queue: b + "q:" + id, pre: b + "qpre:" + id, who: b + "qwho:" + id, num: b + "qnum:" + id,
		pass: b + "qpass:" + id, live: b + "qlive:" + id, stock: stock, outbox: k.Outbox(p), id: id, partition: p}
}

// Partition is the Redis partition every key of the queue lives in: its
// product's, or its drop's.
func (r Ref) Partition() int {
	if r.Kind == OfDrop {
		return inventory.DropPartition(r.ID)
	}
	return inventory.PartitionOf(r.ID)
}

// ParseRef reads a queue's id ("sku:<sku>" or "drop:<drop>").
func ParseRef(id string) (Ref, bool) {
	kind, rest, ok := strings.Cut(id, ":")
	if !ok || rest == "" || (Kind(kind) != OfProduct && Kind(kind) != OfDrop) {
		return Ref{}, false
	}
	return Ref{Kind: Kind(kind), ID: rest}, true
}

// Channel is the sharded pub/sub channel a queue's state is announced on
// (admit_queue.lua, queue_publish in lib.lua): {p}qchanged:<queue>, in the
// queue's partition, so one pub/sub connection per partition carries it
// with the stock of the partition's SKUs.
func Channel(k inventory.Keys, r Ref) string {
	return k.Base(r.Partition()) + "qchanged:" + r.String()
}
