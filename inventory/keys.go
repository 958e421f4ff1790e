package inventory

import (
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// The key layout lives in package script (Keys there builds every name);
// these names keep the engine's callers (the worker, the queue, the tests)
// as they were.

// Partitions is the number of hash-tag partitions the keyspace is cut into.
const Partitions = script.Partitions

// Keys builds every Redis key Dropline uses (see script.Keys).
type Keys = script.Keys

// NewKeys returns the key builder for a prefix such as "dl:".
func NewKeys(prefix string) Keys { return script.NewKeys(prefix) }

// PartitionOf returns the partition of a SKU of its own, in no drop.
func PartitionOf(sku string) int { return script.PartitionOf(sku) }

// DropPartition is the partition of a drop, and of every SKU in it.
func DropPartition(drop string) int { return script.DropPartition(drop) }

func idempotencyHash(principal, key string) string { return core.IdempotencyHash(principal, key) }

func requestHash(sku string, quantity int, holdMillis int64) string {
	return core.RequestHash(sku, quantity, holdMillis)
}

func place(k Keys, sku, drop string) { core.Place(k, sku, drop) }
