package resolvers

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/dropline/dropline/inventory"
)

// Global object ids (Relay object identification) are base64 of
// "<Type>:<key>", so clients treat them as opaque and one id space covers
// every Node.
const (
	typeProduct     = "Product"
	typeReservation = "Reservation"
	typeStock       = "Stock"
	typeCart        = "Cart"
	typeDrop        = "Drop"
)

func globalID(typ, key string) string {
	return base64.StdEncoding.EncodeToString([]byte(typ + ":" + key))
}

// parseGlobalID splits a global id; ok is false for anything we did not mint.
func parseGlobalID(id string) (typ, key string, ok bool) {
	b, err := base64.StdEncoding.DecodeString(id)
	if err != nil {
		return "", "", false
	}
	typ, key, ok = strings.Cut(string(b), ":")
	return typ, key, ok && key != ""
}

// Cursors are opaque keyset positions: base64 of a tag and the key the next
// page starts after. The tag keeps a products cursor from being fed to
// myReservations.
const (
	cursorProducts     = "p1"
	cursorReservations = "r1"
)

func productCursor(sku string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorProducts + ":" + sku))
}

func parseProductCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", errBadCursor
	}
	tag, sku, ok := strings.Cut(string(b), ":")
	if !ok || tag != cursorProducts || !inventory.ValidSKU(sku) {
		return "", errBadCursor
	}
	return sku, nil
}

func reservationCursor(r inventory.Reservation) string {
	s := fmt.Sprintf("%s:%d:%s", cursorReservations, r.CreatedAt.UnixMicro(), r.Token)
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func parseReservationCursor(c string) (*inventory.ReservationCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, errBadCursor
	}
	parts := strings.SplitN(string(b), ":", 3)
	if len(parts) != 3 || parts[0] != cursorReservations || parts[2] == "" {
		return nil, errBadCursor
	}
	var us int64
	if _, err := fmt.Sscan(parts[1], &us); err != nil {
		return nil, errBadCursor
	}
	return &inventory.ReservationCursor{CreatedAt: time.UnixMicro(us).UTC(), Token: parts[2]}, nil
}

// errBadCursor is reported on the "after" argument.
var errBadCursor = &inventory.InvalidInputError{Field: "after", Reason: "not a cursor this API issued"}
