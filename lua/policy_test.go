package lua

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory/policy"
)

// mayTakeProbe asks lib.lua's may_take one question, with the SKU's quota
// hash in KEYS[1] and the state in ARGV, and answers {'OK'} or the refusal,
// every part a string.
const mayTakeProbe = `
local function str(v)
  if type(v) == 'number' then
    return string.format('%d', v)
  end
  return tostring(v)
end
local view = { sku = ARGV[3], mode = ARGV[4], max = tonumber(ARGV[5]), starts = tonumber(ARGV[6]),
  ends = tonumber(ARGV[7]), drop = ARGV[8] ~= '' and ARGV[8] or nil, quota = KEYS[1], free = tonumber(ARGV[9]),
  pass = ARGV[14] }
local r = may_take(ARGV[2], ARGV[1], view, ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]))
if not r then
  return { 'OK' }
end
return { str(r[1]), str(r[2]), str(r[3]) }
`

// TestPolicyInLuaAnswersAsInGo asks may_take (on a real Redis, with the
// buyer's counts and the drop written as the engine writes them) and
// policy.Check the same question for every mode and every path, in states
// that pass and that each limit refuses: they must answer alike, refusal
// and details included.
func TestPolicyInLuaAnswersAsInGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.Redis(t)
	src, err := withLibrary(mayTakeProbe)
	if err != nil {
		t.Fatal(err)
	}
	probe := redis.NewScript(src)
	base := r.Prefix + "{p03}:"
	const now = int64(1_700_000_000_000)
	// Every limit is at its boundary: held + asked is the limit, here and in
	// the drop; "the last units" and "opens now" put the stock and the
	// window at theirs.
	open := policy.State{Now: now, Max: 3, Held: 1, Free: 5, Qty: 2}
	dropped := open
	dropped.InDrop, dropped.DropMax, dropped.DropHeld = true, 4, 2 // 1 of this SKU, 1 of its sibling
	states := map[string]policy.State{"open": open, "in a drop": dropped}
	edit := func(name string, from policy.State, f func(*policy.State)) {
		st := from
		f(&st)
		states[name] = st
	}
	edit("no limits", open, func(s *policy.State) { s.Max = 0 })
	edit("before the sale", open, func(s *policy.State) { s.Starts = now + 1 })
	edit("after the sale", open, func(s *policy.State) { s.Starts, s.Ends = now-10, now })
	edit("above the SKU's limit", open, func(s *policy.State) { s.Held = 2 })
	edit("out of stock", open, func(s *policy.State) { s.Free = 1 })
	edit("the last units", open, func(s *policy.State) { s.Free = 2 })
	edit("opens now", dropped, func(s *policy.State) { s.Starts, s.DropStarts = now, now })
	edit("drop not open", dropped, func(s *policy.State) { s.DropStarts, s.DropEnds = now+5, now+50 })
	edit("above the drop's limit", dropped, func(s *policy.State) { s.DropHeld = 3 })
	edit("a cart's other lines fill the drop", dropped, func(s *policy.State) { s.DropQty = 3 })
	edit("a valid pass", open, func(s *policy.State) { s.Pass = policy.PassValid })
	edit("a valid pass, in a drop", dropped, func(s *policy.State) { s.Pass = policy.PassValid })
	edit("a valid pass, out of stock", open, func(s *policy.State) { s.Pass, s.Free = policy.PassValid, 1 })
	edit("an expired pass", open, func(s *policy.State) { s.Pass = policy.PassExpired })
	edit("another pass, before the sale", open, func(s *policy.State) { s.Pass, s.Starts = policy.PassInvalid, now+1 })
	edit("every limit at once", dropped, func(s *policy.State) {
		s.Starts, s.Held, s.DropStarts, s.DropHeld, s.Free = now+1, 3, now+1, 9, 0
	})

	asked := 0
	for name, st := range states {
		for _, mode := range policy.Modes {
			for _, path := range policy.Paths {
				sku, who := fmt.Sprintf("S%d", asked), fmt.Sprintf("buyer-%d", asked)
				asked++
				quota := base + "quota:" + sku
				drop := ""
				if err := r.Client.HSet(ctx, quota, who, st.Held).Err(); err != nil {
					t.Fatal(err)
				}
				if st.InDrop {
					drop = "D" + sku
					sib := sku + "-SIB"
					if err := r.Client.HSet(ctx, base+"drop:"+drop, "max", st.DropMax, "start", st.DropStarts, "end", st.DropEnds,
						"skus", sku+" "+sib).Err(); err != nil {
						t.Fatal(err)
					}
					if err := r.Client.HSet(ctx, base+"sku:"+sib, "gen", "1").Err(); err != nil {
						t.Fatal(err)
					}
					if err := r.Client.HSet(ctx, base+"quota:"+sib, who, st.DropHeld-st.Held).Err(); err != nil {
						t.Fatal(err)
					}
				}
				// The buyer's pass of the queue (the SKU's or its drop's),
				// as admit_queue.lua records it, and the pass presented.
				pass, scope := "", "sku:"+sku
				if drop != "" {
					scope = "drop:" + drop
				}
				record := map[policy.PassState]string{
					policy.PassValid:   fmt.Sprintf("P-%d|%d|A|7", asked, st.Now+1),
					policy.PassExpired: fmt.Sprintf("P-%d|%d|A|7", asked, st.Now),
					policy.PassInvalid: fmt.Sprintf("P-%d|%d|U|7", asked, st.Now+1),
				}[st.Pass]
				if st.Pass != policy.PassNone {
					pass = fmt.Sprintf("P-%d", asked)
					if err := r.Client.HSet(ctx, base+"qpass:"+scope, who, record).Err(); err != nil {
						t.Fatal(err)
					}
				}
				dropQty := st.DropQty
				if dropQty == 0 {
					dropQty = st.Qty
				}
				got, err := probe.Run(ctx, r.Client, []string{quota}, base, string(path), sku, string(mode), st.Max, st.Starts,
					st.Ends, drop, st.Free, who, st.Qty, st.Now, dropQty, pass).StringSlice()
				if err != nil {
					t.Fatalf("%s, %s, %s: %v", name, mode, path, err)
				}
				want := []string{"OK"}
				if no := policy.Check(mode, path, st); no != nil {
					want = []string{string(no.Code), no.A, no.B}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s, mode %s, path %s: Lua answers %q, Go %q", name, mode, path, got, want)
				}
			}
		}
	}
	if want := len(states) * len(policy.Modes) * len(policy.Paths); asked != want {
		t.Fatalf("asked %d questions, want %d", asked, want)
	}
	t.Logf("%s questions, every mode and path in %d states, answered alike", strconv.Itoa(asked), len(states))
}
