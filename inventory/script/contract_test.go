package script

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/dropline/dropline/lua"
)

// sample is one typed call of a script, with the lengths its KEYS and ARGV
// must have: the header's fixed ones plus, for a script that takes items
// (requests, lines, holds, entries), items times each item's share.
type sample struct {
	call       Call
	keys, argv int
	// derives lists lib.lua's key helpers the script reaches, directly or
	// through other helpers of lib.lua (handoff, may_take, ...): the keys it
	// builds from the partition base rather than takes in KEYS.
	derives []string
}

const testPrefix = "t:"

// samples builds one call of each of the engine's scripts through its typed
// arguments.
func samples() map[string]sample {
	k := NewKeys(testPrefix)
	const sku, tok = "SKU-1", "r03.tok"
	p := k.PartitionOf(sku)
	lines := []CartLine{{SKU: sku, Quantity: 1, Token: "l03.a"}, {SKU: sku, Quantity: 2, Token: "l03.b"}}
	// handoff (lib.lua) gives freed units to waiters: it makes holds, and
	// asks may_take, which reads the drop's and the queue's keys.
	handoff := []string{"drop_key", "hold_key", "pass_keys", "sku_keys", "walks_key"}
	take := []string{"drop_key", "pass_keys", "sku_keys"}
	// A script that knows its hold by token derives the SKU's waitlist too.
	byToken := union(handoff, []string{"wait_keys"})
	return map[string]sample{
		lua.Reserve: {call: Reserve{Partition: p, Requests: []ReserveRequest{{SKU: sku, Token: tok}, {SKU: sku, Token: "r03.two", Idem: "h"}}}.Call(k),
			keys: 2 + 3 + 1*2, argv: 7 + 1 + 9*2, derives: union(take, []string{"hold_key", "idem_key"})},
		lua.BeginCommit:  {call: BeginCommit{Partition: p, Token: tok}.Call(k), keys: 4, argv: 6, derives: byToken},
		lua.FinishCommit: {call: FinishCommit{Partition: p, Token: tok, SKU: sku}.Call(k), keys: 9, argv: 10, derives: handoff},
		lua.ReleaseHold:  {call: ReleaseHold{Partition: p, Token: tok}.Call(k), keys: 4, argv: 8, derives: byToken},
		lua.ExtendHold:   {call: ExtendHold{Partition: p, Token: tok}.Call(k), keys: 3, argv: 10, derives: []string{"sku_keys"}},
		lua.StageRebuild: {call: StageRebuild{SKU: sku}.Call(k), keys: 3, argv: 1},
		lua.HydrateSKU: {call: HydrateSKU{SKU: sku, Holds: []HydrateHold{{Token: tok}}, Quota: []QuotaCount{{"a", 1}, {"b", 2}}}.Call(k),
			keys: 5, argv: 8 + HydrateHoldFields + 1 + 2*2, derives: []string{"hold_key", "idem_key"}},
		lua.PublishSKU:          {call: PublishSKU{SKU: sku}.Call(k), keys: 11, argv: 15, derives: handoff},
		lua.ApplyProduct:        {call: ApplyProduct{SKU: sku}.Call(k), keys: 7, argv: 8, derives: handoff},
		lua.ApplyDrop:           {call: ApplyDrop{Drop: "D1", SKUs: []string{"A", "B"}}.Call(k), keys: 1, argv: 5},
		lua.DueHolds:            {call: DueHolds{Partition: p, Limit: 10}.Call(k), keys: 1, argv: 1},
		lua.ReconcileHold:       {call: ReconcileHold{Partition: p, Token: tok, SKU: sku, Idem: "h"}.Call(k), keys: 10, argv: 15, derives: handoff},
		lua.AckApplied:          {call: AckApplied{Partition: p, SKUs: []string{sku}, Generations: []string{"1"}, IDs: []string{"1-0", "2-0"}}.Call(k), keys: 1 + 1, argv: 2 + 1 + 2},
		lua.ClaimIdempotencyKey: {call: ClaimIdempotencyKey{Idem: "h", SKU: sku}.Call(k), keys: 2, argv: 4},
		lua.StageWaitlist:       {call: StageWaitlist{SKU: sku, Entries: []WaitlistEntry{{Principal: "a"}}}.Call(k), keys: 4, argv: 4 + 7},
		lua.JoinWaitlist:        {call: JoinWaitlist{SKU: sku}.Call(k), keys: 7, argv: 11, derives: handoff},
		lua.LeaveWaitlist:       {call: LeaveWaitlist{SKU: sku}.Call(k), keys: 7, argv: 2},
		lua.OpenCart:            {call: OpenCart{Home: 3, Token: "c03.c", Idem: "h"}.Call(k), keys: 3, argv: 10, derives: []string{"cart_key"}},
		lua.HoldCartLines:       {call: HoldCartLines{Partition: p, Cart: "c03.c", Lines: lines}.Call(k), keys: 1 + 4*2, argv: 6 + 3*2, derives: take},
		lua.ConfirmCartLines:    {call: ConfirmCartLines{Partition: p, Cart: "c03.c", Lines: lines}.Call(k), keys: 2 + 2*2, argv: 2 + 2},
		lua.FinishCart:          {call: FinishCart{Home: 3, Token: "c03.c", Idem: "h"}.Call(k), keys: 3, argv: 5},
		lua.AbandonCart:         {call: AbandonCart{Home: 3, Token: "c03.c"}.Call(k), keys: 2, argv: 1},
		lua.ExtendCart:          {call: ExtendCart{Home: 3, Token: "c03.c"}.Call(k), keys: 2, argv: 3},
		lua.ApplyDraw: {call: ApplyDraw{SKU: sku, Entries: []DrawEntry{{Won: true}, {}}}.Call(k), keys: 8, argv: 7 + 4*2,
			derives: handoff},
		lua.RateLimit:    {call: RateLimit{Key: "rate:t:budget:alice"}.Call(k), keys: 1, argv: 4},
		lua.ContinueWalk: {call: ContinueWalk{Partition: p, SKU: sku}.Call(k), keys: 8, argv: 3, derives: handoff},
	}
}

func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	sort.Strings(out)
	return slices.Compact(out)
}

func readLua(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../lua/" + name + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func header(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func code(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

var (
	fixedKey  = regexp.MustCompile(`KEYS\[(\d+)\]\s+(\S+)`)
	fixedArgv = regexp.MustCompile(`ARGV\[(\d+)\]`)
	baseArgv  = regexp.MustCompile(`ARGV\[(\d+)\]\s+partition base`)
)

// keyPattern turns a header's key, such as {p}hold:<token>, into a regular
// expression over the key the caller builds.
func keyPattern(h string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^" + regexp.QuoteMeta(testPrefix))
	rest := h
	tag := regexp.MustCompile(`^\{([a-z])(\d\d)?\}`).FindStringSubmatch(rest)
	if tag[2] != "" {
		b.WriteString(regexp.QuoteMeta("{p" + tag[2] + "}:"))
	} else {
		b.WriteString(`\{p\d\d\}:`)
	}
	rest = rest[len(tag[0]):]
	for _, part := range regexp.MustCompile(`<[a-z_]+>|[^<]+`).FindAllString(rest, -1) {
		if strings.HasPrefix(part, "<") {
			b.WriteString(`[^{}]+`)
		} else {
			b.WriteString(regexp.QuoteMeta(part))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// TestCallsMatchTheirHeaders checks each typed function's KEYS and ARGV
// against its script's header: every KEYS[n] the header names is the key it
// says, every key is of one partition, the counts are the header's, and
// the ARGV the header gives as the partition base is that partition's.
func TestCallsMatchTheirHeaders(t *testing.T) {
	s := samples()
	for _, name := range lua.Engine {
		smp, ok := s[name]
		if !ok {
			t.Errorf("%s has no typed function in package script", name)
			continue
		}
		c := smp.call
		if c.Script != name {
			t.Errorf("%s: the typed call runs %s", name, c.Script)
		}
		h := header(readLua(t, name))
		maxKey, maxArgv := 0, 0
		for _, m := range fixedKey.FindAllStringSubmatch(h, -1) {
			i, _ := strconv.Atoi(m[1])
			maxKey = max(maxKey, i)
			if !strings.HasPrefix(m[2], "{") || i > len(c.Keys) {
				continue
			}
			if !keyPattern(m[2]).MatchString(c.Keys[i-1]) {
				t.Errorf("%s: KEYS[%d] is %q; the header says %s", name, i, c.Keys[i-1], m[2])
			}
		}
		for _, m := range fixedArgv.FindAllStringSubmatch(h, -1) {
			i, _ := strconv.Atoi(m[1])
			maxArgv = max(maxArgv, i)
		}
		if len(c.Keys) != smp.keys || len(c.Keys) < maxKey {
			t.Errorf("%s: %d KEYS, want %d (the header names up to KEYS[%d])", name, len(c.Keys), smp.keys, maxKey)
		}
		if len(c.Argv) != smp.argv || len(c.Argv) < maxArgv {
			t.Errorf("%s: %d ARGV, want %d (the header names up to ARGV[%d])", name, len(c.Argv), smp.argv, maxArgv)
		}
		if name == lua.RateLimit {
			continue // its key lives in its own slot, outside the partitions
		}
		tag := regexp.MustCompile(`\{p\d\d\}`)
		first := tag.FindString(c.Keys[0])
		for i, key := range c.Keys {
			if got := tag.FindString(key); got != first {
				t.Errorf("%s: KEYS[%d] %q is not in KEYS[1]'s partition %s", name, i+1, key, first)
			}
		}
		if m := baseArgv.FindStringSubmatch(h); m != nil {
			i, _ := strconv.Atoi(m[1])
			if want := testPrefix + first + ":"; c.Argv[i-1] != want {
				t.Errorf("%s: ARGV[%d] is %v, not the partition base %q of its KEYS", name, i, c.Argv[i-1], want)
			}
		} else if len(smp.derives) > 0 {
			t.Errorf("%s derives keys but its header names no ARGV as the partition base", name)
		}
	}
}

// libFunctions reads lib.lua's local functions and the ones each calls.
func libFunctions(t *testing.T) map[string][]string {
	src := code(readLua(t, "lib"))
	decl := regexp.MustCompile(`(?m)^local function (\w+)\(`)
	locs := decl.FindAllStringSubmatchIndex(src, -1)
	names := map[string]bool{}
	for _, l := range locs {
		names[src[l[2]:l[3]]] = true
	}
	calls := map[string][]string{}
	for i, l := range locs {
		end := len(src)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		name := src[l[2]:l[3]]
		calls[name] = calledIn(src[l[1]:end], names)
	}
	return calls
}

func calledIn(body string, names map[string]bool) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\b(\w+)\(`).FindAllStringSubmatch(body, -1) {
		if names[m[1]] && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// keyHelpers are lib.lua's functions that build a key name from the
// partition base.
var keyHelpers = []string{"cart_key", "drop_key", "hold_key", "idem_key", "pass_keys", "sku_keys", "wait_keys", "walks_key"}

// TestDerivedKeysAreDeclared follows each script's calls into lib.lua (a
// script that calls handoff reaches give_hold, hold_key and sku_keys) and
// checks that the key helpers it reaches are the ones declared above, so
// a script that starts deriving a key, through however many helpers, is
// seen here; TestCallsMatchTheirHeaders then checks that its base is its
// KEYS' partition.
func TestDerivedKeysAreDeclared(t *testing.T) {
	lib := libFunctions(t)
	names := map[string]bool{}
	for n := range lib {
		names[n] = true
	}
	for _, h := range keyHelpers {
		if !names[h] {
			t.Fatalf("lib.lua has no %s", h)
		}
	}
	for name, smp := range samples() {
		reached := map[string]bool{}
		todo := calledIn(code(readLua(t, name)), names)
		for len(todo) > 0 {
			f := todo[0]
			todo = todo[1:]
			if reached[f] {
				continue
			}
			reached[f] = true
			todo = append(todo, lib[f]...)
		}
		var got []string
		for _, h := range keyHelpers {
			if reached[h] {
				got = append(got, h)
			}
		}
		want := slices.Clone(smp.derives)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s derives keys through %v; its sample declares %v", name, got, want)
		}
	}
}
