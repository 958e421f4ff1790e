// Package policy is the one place that decides who may take units of a
// product. A product is sold in one mode (first come, or by draw); units
// reach buyers along a few paths (a reserve, a cart line, a waitlist offer, a
// draw's result, an admission pass), and joining a waitlist asks whether the
// joiner could ever be served. Which modes admit which path, and which limits
// (the sale window, the per-person limit of the SKU, the window and limit of
// its drop, the stock) each path is held to, is written here once.
//
// The Redis scripts decide with the same rules: lua/lua.go renders Admits,
// Limits and Refuse into the library every script starts with, and lib.lua's
// may_take, which every script that hands out units calls before it writes,
// reads them; lua's tests check that may_take and Check answer alike for
// every mode and path. A new mode is a new entry in the tables below, and a
// new path a new Path that the tables name: neither can forget a check.
//
// The package knows nothing of Redis or Postgres; its refusals are package
// outcome's codes.
package policy

import (
	"slices"
	"strconv"

	"github.com/dropline/dropline/inventory/outcome"
)

// Mode is how a product is sold.
type Mode string

// The sale modes.
const (
	// FirstCome sells to whoever reserves first: reserves, carts and the
	// waitlist.
	FirstCome Mode = "first_come"
	// Draw sells to the winners of a draw; its losers wait in the waitlist,
	// which units the winners free go to.
	Draw Mode = "draw"
	// Queue sells like FirstCome, but a reserve, a cart line or a join is
	// held to the AdmissionPass limit: only a holder of a valid pass, handed
	// out by the product's (or its drop's) admission queue in ticket order,
	// takes units. The admission itself is the Pass path.
	Queue Mode = "queue"
)

// Modes lists every mode, in a fixed order.
var Modes = []Mode{FirstCome, Draw, Queue}

// ModeOf is the mode of a product, from the ledger's flags (a product is
// never both sold by draw and queued: the ledger refuses it).
func ModeOf(byDraw, queued bool) Mode {
	switch {
	case byDraw:
		return Draw
	case queued:
		return Queue
	}
	return FirstCome
}

// Path is a way units reach a buyer.
type Path string

// The paths.
const (
	// Reserve is a first-come reserve (reserve.lua).
	Reserve Path = "reserve"
	// Cart is a line of a cart (hold_cart_lines.lua).
	Cart Path = "cart"
	// Offer is units handed to a waiter (handoff in lib.lua).
	Offer Path = "offer"
	// DrawResult is a draw's winner getting its units (apply_draw.lua, and
	// the draw's decision in inventory).
	DrawResult Path = "draw"
	// Join is joining a waitlist: it takes no unit, but is refused when the
	// joiner could never be served (join_waitlist.lua).
	Join Path = "join"
	// Pass is the admission queue handing out a pass: a right to take units
	// for a short while, which it gives only while free units outnumber the
	// passes not yet spent (admit_queue.lua). It names no buyer, so it is
	// held to no per-person limit.
	Pass Path = "pass"
)

// Paths lists every path, in a fixed order.
var Paths = []Path{Reserve, Cart, Offer, DrawResult, Join, Pass}

// Limit is one check a path is held to.
type Limit string

// The limits, in the order they are checked.
const (
	// AdmissionPass: in a mode that NeedsPass, the buyer presents a pass
	// of the product's (or its drop's) queue, issued to it, not spent, not
	// expired. Other modes pass it.
	AdmissionPass Limit = "pass"
	// SaleWindow: now within the SKU's saleStartsAt..saleEndsAt.
	SaleWindow Limit = "window"
	// SKULimit: what the buyer holds or bought of the SKU, plus the units
	// asked, within the SKU's per-person limit.
	SKULimit Limit = "sku_limit"
	// DropWindow: now within the window of the SKU's drop.
	DropWindow Limit = "drop_window"
	// DropLimit: what the buyer holds or bought of every SKU of the drop,
	// plus the units asked, within the drop's per-person limit.
	DropLimit Limit = "drop_limit"
	// Stock: the units asked fit the units free to the path (Free).
	Stock Limit = "stock"
)

// Limits lists every limit, in the order Check checks them.
var Limits = []Limit{AdmissionPass, SaleWindow, SKULimit, DropWindow, DropLimit, Stock}

// admits says which paths each mode lets take units.
var admits = map[Mode][]Path{
	FirstCome: {Reserve, Cart, Offer, Join},
	Draw:      {DrawResult, Offer},
	Queue:     {Reserve, Cart, Offer, Join, Pass},
}

// NeedsPass reports whether mode holds its paths to the AdmissionPass limit.
// A waitlist's offer is not: its waiter presented a pass to join.
func NeedsPass(mode Mode) bool { return mode == Queue }

// limits says which limits each path is held to. A draw's result is not
// held to a sale window: the draw's window is its entries' (checked when
// entering), and its result is carried to buyers after it closes. A join
// takes nothing yet, so it is not held to the stock; it is held to the
// limits because a joiner they refuse could never be served.
var limits = map[Path][]Limit{
	Reserve:    {AdmissionPass, SaleWindow, SKULimit, DropWindow, DropLimit, Stock},
	Cart:       {AdmissionPass, SaleWindow, SKULimit, DropWindow, DropLimit, Stock},
	Offer:      {SaleWindow, SKULimit, DropWindow, DropLimit, Stock},
	DrawResult: {SKULimit, DropLimit, Stock},
	Join:       {AdmissionPass, SaleWindow, SKULimit, DropWindow, DropLimit},
	Pass:       {SaleWindow, DropWindow, Stock},
}

// Admits reports whether mode lets path take units.
func Admits(mode Mode, path Path) bool { return slices.Contains(admits[mode], path) }

// Applies reports whether path is held to limit.
func Applies(path Path, limit Limit) bool { return slices.Contains(limits[path], limit) }

// Code names a refusal, as the scripts answer it and the API reports it: the
// code of one of package outcome's business outcomes.
type Code = outcome.Code

// The refusals.
var (
	CodeDrawOnly      = outcome.ErrDrawOnly.Code()
	CodeInvalidInput  = outcome.ErrInvalidInput.Code()
	CodeSaleNotActive = outcome.ErrSaleNotActive.Code()
	CodeQuotaExceeded = outcome.ErrQuotaExceeded.Code()
	CodeOutOfStock    = outcome.ErrOutOfStock.Code()
	// CodeQueueRequired: a queued product, and no pass presented.
	CodeQueueRequired = outcome.ErrQueueRequired.Code()
	// CodePassExpired: the buyer's pass, past its expiry.
	CodePassExpired = outcome.ErrPassExpired.Code()
	// CodePassInvalid: a pass that is not the buyer's current one for this
	// queue (forged, another's, another queue's, or spent already).
	CodePassInvalid = outcome.ErrPassInvalid.Code()
)

// Refusal is why a path may not take units: a code and two details, as the
// scripts answer {code, a, b} (SALE_NOT_ACTIVE {starts_ms, ends_ms},
// QUOTA_EXCEEDED {limit, already}, OUT_OF_STOCK {free, 0}, a mode's refusal
// its own).
type Refusal struct {
	Code Code
	A, B string
}

// Refuse is how a mode refuses a path it does not admit. A product sold by
// draw answers DRAW_ONLY (enter the draw instead); a first-come product
// refuses the paths of other modes as invalid input, which only a caller
// that has the wrong product can meet.
func Refuse(mode Mode) Refusal {
	if mode == Draw {
		return Refusal{Code: CodeDrawOnly}
	}
	return Refusal{Code: CodeInvalidInput, A: "sku", B: "this product is sold first come, first served"}
}

// PassState is what the buyer's presented pass is, as lib.lua's pass_check
// finds it against the queue's record of the buyer.
type PassState int

// The states of a presented pass.
const (
	PassNone PassState = iota
	PassValid
	PassExpired
	PassInvalid
)

// passRefusal is how the AdmissionPass limit refuses each state but PassValid.
var passRefusal = map[PassState]Code{PassNone: CodeQueueRequired, PassExpired: CodePassExpired, PassInvalid: CodePassInvalid}

// State is what a decision looks at: the SKU's settings and counters, its
// drop's, the buyer's counts and the request. Times are milliseconds since
// the epoch; a zero bound or limit is none.
type State struct {
	Now          int64
	Starts, Ends int64
	Max          int // the SKU's per-person limit
	Held         int // units the buyer holds or bought of the SKU
	InDrop       bool
	DropStarts   int64
	DropEnds     int64
	DropMax      int // the drop's per-person limit (a drop always has one)
	DropHeld     int // units the buyer holds or bought of the drop's SKUs
	Free         int // units the path may take from
	Qty          int // units asked
	DropQty      int // units counted against the drop; 0 means Qty
	Pass         PassState
}

// Check decides whether path may take st.Qty units of a product sold in
// mode: nil, or the first refusal in the order of Limits (after the mode's).
// lib.lua's may_take decides the same way.
func Check(mode Mode, path Path, st State) *Refusal {
	if !Admits(mode, path) {
		r := Refuse(mode)
		return &r
	}
	outside := func(now, starts, ends int64) bool { return (starts > 0 && now < starts) || (ends > 0 && now >= ends) }
	dropQty := st.DropQty
	if dropQty == 0 {
		dropQty = st.Qty
	}
	for _, l := range limits[path] {
		switch {
		case l == AdmissionPass && NeedsPass(mode) && st.Pass != PassValid:
			return &Refusal{Code: passRefusal[st.Pass]}
		case l == SaleWindow && outside(st.Now, st.Starts, st.Ends):
			return &Refusal{Code: CodeSaleNotActive, A: itoa(st.Starts), B: itoa(st.Ends)}
		case l == SKULimit && st.Max > 0 && st.Held+st.Qty > st.Max:
			return &Refusal{Code: CodeQuotaExceeded, A: itoa(st.Max), B: itoa(st.Held)}
		case l == DropWindow && st.InDrop && outside(st.Now, st.DropStarts, st.DropEnds):
			return &Refusal{Code: CodeSaleNotActive, A: itoa(st.DropStarts), B: itoa(st.DropEnds)}
		case l == DropLimit && st.InDrop && st.DropHeld+dropQty > st.DropMax:
			return &Refusal{Code: CodeQuotaExceeded, A: itoa(st.DropMax), B: itoa(st.DropHeld)}
		case l == Stock && st.Free < st.Qty:
			return &Refusal{Code: CodeOutOfStock, A: itoa(st.Free), B: "0"}
		}
	}
	return nil
}

func itoa[T int | int64](n T) string { return strconv.FormatInt(int64(n), 10) }
