package script

import (
	"strconv"
)

// Reply is a script's raw reply: a list whose first element is a code, the
// rest as the script's header says. Positions are read in this package
// only, by the decoders of the typed replies (reply shapes shared by several
// scripts: hold_reply, wait_reply, a rejection).
type Reply []any

// Code is the reply's first element: what the script says happened.
func (r Reply) Code() string { return r.Str(0) }

// Str is element i as a string ("" when absent).
func (r Reply) Str(i int) string {
	if i >= len(r) {
		return ""
	}
	switch v := r[i].(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return ""
}

// Int is element i as an integer (0 when absent or not a number).
func (r Reply) Int(i int) int64 {
	if i >= len(r) {
		return 0
	}
	switch v := r[i].(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

// Bool is element i as lib.lua's 1/0 flags.
func (r Reply) Bool(i int) bool { return r.Int(i) == 1 }

// codeNeedsHydration is every engine script's "the SKU is not loaded" code:
// {NEEDS_HYDRATION, sku}.
const codeNeedsHydration = "NEEDS_HYDRATION"

// missing is the SKU of a NEEDS_HYDRATION or WALK_PENDING reply, {code, sku}.
func (r Reply) missing() string { return r.Str(1) }

// Hold is lib.lua's hold_reply: {code, token, sku, who, qty, status,
// expires_ms, created_ms, committed_ms, ended_ms, replayed, extensions}.
// Missing is set instead for {NEEDS_HYDRATION, sku}.
type Hold struct {
	Code               string
	Token, SKU, Who    string
	Qty                int
	Status             string
	Exp, Ctd, Cmt, End int64 // ms
	Replayed           bool  // the script changed nothing and returned an earlier outcome
	Extensions         int
	Missing            string // NEEDS_HYDRATION's SKU
}

// HoldOf decodes a hold_reply (or a NEEDS_HYDRATION reply).
func HoldOf(r Reply) Hold {
	if r.Code() == codeNeedsHydration {
		return Hold{Code: codeNeedsHydration, Missing: r.missing()}
	}
	return Hold{Code: r.Code(), Token: r.Str(1), SKU: r.Str(2), Who: r.Str(3), Qty: int(r.Int(4)), Status: r.Str(5),
		Exp: r.Int(6), Ctd: r.Int(7), Cmt: r.Int(8), End: r.Int(9), Replayed: r.Bool(10), Extensions: int(r.Int(11))}
}

// Rejection is a refusal of reserve.lua, hold_cart_lines.lua or
// join_waitlist.lua: {code, a, b, replayed}, whose a and b the code gives a
// meaning (OUT_OF_STOCK {available}, QUOTA_EXCEEDED {limit, already}, ...).
type Rejection struct {
	Code, A, B string
	Replayed   bool
}

// IntA and IntB are A and B as integers (0 when they are not).
func (r Rejection) IntA() int64 { n, _ := strconv.ParseInt(r.A, 10, 64); return n }

// IntB is B as an integer.
func (r Rejection) IntB() int64 { n, _ := strconv.ParseInt(r.B, 10, 64); return n }

func rejectionOf(r Reply) Rejection {
	return Rejection{Code: r.Code(), A: r.Str(1), B: r.Str(2), Replayed: r.Bool(3)}
}

// Wait is lib.lua's wait_reply: {code, sku, who, seq, qty, hold_ms, status,
// token, position, joined_ms, replayed}; Rejection is set for a refusal
// (the code is then not OK), Missing for {NEEDS_HYDRATION, sku}.
type Wait struct {
	Code      string
	SKU, Who  string
	Seq       int64
	Qty       int
	HoldMs    int64
	Status    string // W, O or L
	Token     string
	Position  int
	JoinedMs  int64
	Replayed  bool
	Rejection Rejection
	Missing   string
}

// WaitOf decodes a wait_reply, a rejection or a NEEDS_HYDRATION reply.
func WaitOf(r Reply) Wait {
	switch r.Code() {
	case "OK":
		return Wait{Code: "OK", SKU: r.Str(1), Who: r.Str(2), Seq: r.Int(3), Qty: int(r.Int(4)), HoldMs: r.Int(5),
			Status: r.Str(6), Token: r.Str(7), Position: int(r.Int(8)), JoinedMs: r.Int(9), Replayed: r.Bool(10)}
	case codeNeedsHydration:
		return Wait{Code: codeNeedsHydration, Missing: r.missing()}
	}
	return Wait{Code: r.Code(), Rejection: rejectionOf(r)}
}

// Result is the reply of a script that answers only a code, or a code and
// the SKU to rebuild ({NEEDS_HYDRATION, sku}).
type Result struct {
	Code    string
	Missing string
}

// ResultOf decodes a code-only reply.
func ResultOf(r Reply) Result {
	res := Result{Code: r.Code()}
	if res.Code == codeNeedsHydration {
		res.Missing = r.missing()
	}
	return res
}
