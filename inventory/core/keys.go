package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/dropline/dropline/inventory/script"
)

// Place records that sku belongs to drop ("" for none): its keys live in the
// drop's partition (see Drops in doc.go).
func Place(k script.Keys, sku, drop string) {
	if drop != "" {
		k.PlaceAt(sku, script.DropPartition(drop))
	}
}

// IdempotencyHash scopes a client's idempotency key to its principal; the
// hash keeps arbitrary client strings out of key names.
func IdempotencyHash(principal, key string) string {
	sum := sha256.Sum256([]byte(principal + "\x00" + key))
	return hex.EncodeToString(sum[:16])
}

// RequestHash fingerprints what a reserve asked for, to tell a replay from a
// different request that reuses the key.
func RequestHash(sku string, quantity int, holdMillis int64) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", sku, quantity, holdMillis))
	return hex.EncodeToString(sum[:16])
}
