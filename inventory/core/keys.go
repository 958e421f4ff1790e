package core

import "github.com/dropline/dropline/inventory/script"

// Place records that sku belongs to drop ("" for none): its keys live in the
// drop's partition (see Drops in doc.go).
func Place(k script.Keys, sku, drop string) {
	if drop != "" {
		k.PlaceAt(sku, script.DropPartition(drop))
	}
}
