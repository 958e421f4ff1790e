package core

import (
	"testing"
	"time"
)

// Tokens made in the same second share the characters that encode it, so
// the ledger's indexes keyed by token take them in neighbouring pages; the
// rest is random, and every token still parses to its partition.
func TestTokensOfASecondShareTheirStart(t *testing.T) {
	now := time.Unix(1_796_000_000, 0)
	seen := map[string]bool{}
	var first string
	for i := range 200 {
		tok := newTokenAt(TokenHold, 7, now.Add(time.Duration(i)*time.Millisecond))
		if len(tok) != TokenLen || tok[:4] != "r07." {
			t.Fatalf("token %q: want %d characters starting r07.", tok, TokenLen)
		}
		if p, err := ParseToken(tok); err != nil || p != 7 {
			t.Fatalf("ParseToken(%q) = %d, %v; want 7", tok, p, err)
		}
		if seen[tok] {
			t.Fatalf("token %q made twice", tok)
		}
		seen[tok] = true
		// 32 bits of time are the first 6 characters (30 bits) and 2 bits of the 7th.
		if first == "" {
			first = tok
		} else if tok[4:10] != first[4:10] {
			t.Fatalf("tokens of one second start %q and %q", first[4:10], tok[4:10])
		}
	}
	later := newTokenAt(TokenHold, 7, now.Add(time.Hour))
	if later[4:10] == first[4:10] {
		t.Fatalf("tokens an hour apart share their time: %q", later[4:10])
	}
	// The random part differs between any two tokens of the same second.
	a, b := newTokenAt(TokenLine, 3, now), newTokenAt(TokenLine, 3, now)
	if a == b || a[11:] == b[11:] {
		t.Fatalf("two tokens of one second: %q and %q", a, b)
	}
	if p, err := ParseToken(a); err != nil || p != 3 {
		t.Fatalf("ParseToken(%q) = %d, %v; want 3", a, p, err)
	}
}
