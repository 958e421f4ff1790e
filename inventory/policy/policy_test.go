package policy

import "testing"

// TestWhichModeAdmitsWhichPath pins the table every path is decided by: a
// draw's units reach buyers only as its result and through its waitlist's
// offers (a cart is refused like a reserve), a first-come product never
// through a draw's result, and no mode hands out admission passes yet.
func TestWhichModeAdmitsWhichPath(t *testing.T) {
	want := map[Mode]map[Path]Code{
		FirstCome: {Reserve: "", Cart: "", Offer: "", Join: "", DrawResult: CodeInvalidInput, Pass: CodeInvalidInput},
		Draw:      {Reserve: CodeDrawOnly, Cart: CodeDrawOnly, Join: CodeDrawOnly, Pass: CodeDrawOnly, Offer: "", DrawResult: ""},
		Queue: {Reserve: CodeQueueRequired, Cart: CodeQueueRequired, Join: CodeQueueRequired, Offer: "", Pass: "",
			DrawResult: CodeInvalidInput},
	}
	for _, mode := range Modes {
		for _, path := range Paths {
			got := Code("")
			if no := Check(mode, path, State{Qty: 1, Free: 1}); no != nil {
				got = no.Code
			}
			if got != want[mode][path] {
				t.Errorf("mode %s, path %s: %q, want %q", mode, path, got, want[mode][path])
			}
		}
	}
	if ModeOf(true, false) != Draw || ModeOf(false, false) != FirstCome || ModeOf(false, true) != Queue {
		t.Error("ModeOf")
	}
}

// TestJoinIsRefusedWhatCouldNeverBeServed: a join is held to the limits with
// what the buyer holds, but not to the stock.
func TestJoinIsRefusedWhatCouldNeverBeServed(t *testing.T) {
	st := State{Max: 2, Held: 1, Qty: 2, Free: 0}
	if no := Check(FirstCome, Join, st); no == nil || *no != (Refusal{Code: CodeQuotaExceeded, A: "2", B: "1"}) {
		t.Errorf("held 1 + asked 2 over a limit of 2: %v", no)
	}
	st.Qty = 1
	if no := Check(FirstCome, Join, st); no != nil {
		t.Errorf("held 1 + asked 1 within 2, nothing free: %v", no)
	}
	st = State{InDrop: true, DropMax: 1, DropHeld: 1, Qty: 1}
	if no := Check(FirstCome, Join, st); no == nil || no.Code != CodeQuotaExceeded {
		t.Errorf("the drop's limit reached elsewhere: %v", no)
	}
}

// TestAPassIsAskedFirstOnlyOfQueuedProducts: a queued product refuses every
// pass but a valid one with its own code, before any other limit; other
// modes never look at a pass.
func TestAPassIsAskedFirstOnlyOfQueuedProducts(t *testing.T) {
	closed := State{Now: 10, Starts: 20, Qty: 1, Free: 0}
	for pass, want := range map[PassState]Code{PassNone: CodeQueueRequired, PassExpired: CodePassExpired,
		PassInvalid: CodePassInvalid, PassValid: CodeSaleNotActive} {
		st := closed
		st.Pass = pass
		if no := Check(Queue, Reserve, st); no == nil || no.Code != want {
			t.Errorf("pass %d before the sale: %v, want %s", pass, no, want)
		}
		if no := Check(FirstCome, Reserve, st); no == nil || no.Code != CodeSaleNotActive {
			t.Errorf("first come, pass %d: %v", pass, no)
		}
	}
	if no := Check(Queue, Offer, State{Qty: 1, Free: 1}); no != nil {
		t.Errorf("an offer to a waiter needs no pass: %v", no)
	}
	if no := Check(Queue, Pass, State{Qty: 1, Free: 0}); no == nil || no.Code != CodeOutOfStock {
		t.Errorf("no pass without a free unit: %v", no)
	}
}
