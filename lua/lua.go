// Package lua holds Dropline's Redis scripts. Each script is one atomic step of
// the inventory engine; lib.lua is prepended to every one of them, so shared
// helpers need no second round trip. Only package inventory imports this.
package lua

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.lua
var files embed.FS

// Names of the scripts, as the engine loads them.
const (
	Reserve      = "reserve"
	BeginCommit  = "begin_commit"
	FinishCommit = "finish_commit"
	ReleaseHold  = "release_hold"
	StageRebuild = "stage_rebuild"
	HydrateSKU   = "hydrate_sku"
	PublishSKU   = "publish_sku"
	ApplyProduct = "apply_product"
	DueHolds     = "due_holds"
	// ReconcileHold tells Redis what the ledger says of one hold.
	ReconcileHold = "reconcile_hold"
	// ClaimIdempotencyKey pins an idempotency key to its first SKU.
	ClaimIdempotencyKey = "claim_idempotency_key"
)

// All lists every script name, for loading and for tests.
var All = []string{Reserve, BeginCommit, FinishCommit, ReleaseHold, StageRebuild, HydrateSKU, PublishSKU, ApplyProduct, DueHolds,
	ReconcileHold, ClaimIdempotencyKey}

// Source returns the full text of a script: lib.lua followed by the script.
func Source(name string) (string, error) {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		return "", fmt.Errorf("reading lib.lua: %w", err)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %s: %w", name, err)
	}
	var b strings.Builder
	b.Write(lib)
	b.WriteString("\n")
	b.Write(body)
	return b.String(), nil
}
