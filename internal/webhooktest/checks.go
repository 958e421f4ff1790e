package webhooktest

import (
	"bytes"
	"hash/fnv"
	"strconv"
	"testing"
)

// Flaky is a receiver's script for delivery tests: it fails about a third
// of first attempts with a 500 and hangs about a sixth past the sender's
// timeout (by a hash of the webhook-id and the attempt, so a retry may fail
// again), and accepts every fourth attempt.
func Flaky(id string, attempt int) Answer {
	if attempt >= 4 {
		return Accept
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id + "/" + strconv.Itoa(attempt)))
	switch h.Sum32() % 6 {
	case 0, 1:
		return Fail
	case 2:
		return Hang
	}
	return Accept
}

// Recorded is one event as the ledger's webhook outbox recorded it: its
// webhook-id (webhook.MessageID of EventID), its event id, whose order is
// its product's, its type and product, and its payload.
type Recorded struct {
	MessageID string
	EventID   int64
	Type, SKU string
	Payload   []byte
}

// RequireArrivedAsRecorded checks what a receiver accepted against what
// the ledger recorded: every recorded event arrived, byte for byte, none
// that was not recorded, and each product's events in the order of their
// ids. It returns how many arrived more than once (at-least-once delivery
// allows it).
func RequireArrivedAsRecorded(t testing.TB, recorded []Recorded, got []Received) (duplicates int) {
	t.Helper()
	byID := map[string]Recorded{}
	for _, r := range recorded {
		byID[r.MessageID] = r
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, g := range got {
		r, ok := byID[g.ID]
		if !ok {
			t.Fatalf("received %s, which the ledger did not record", g.ID)
		}
		if !bytes.Equal(r.Payload, g.Body) {
			t.Fatalf("%s arrived as %s, recorded as %s", g.ID, g.Body, r.Payload)
		}
		if seen[g.ID] {
			duplicates++
			continue
		}
		seen[g.ID] = true
		if r.EventID <= last[r.SKU] {
			t.Fatalf("%s (%s of %s) arrived after a later event of its product", g.ID, r.Type, r.SKU)
		}
		last[r.SKU] = r.EventID
	}
	if len(seen) != len(recorded) {
		t.Fatalf("%d of the %d recorded events arrived", len(seen), len(recorded))
	}
	return duplicates
}
