package core

import (
	"errors"
	"time"
	"unicode/utf8"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/outcome"
)

// ValidSKU reports whether s may name a product: 1–64 of A–Z a–z 0–9 . _ -
func ValidSKU(s string) bool { return validName(s, 64, false) }

// ValidPrincipal reports whether s may name a principal: 1–128 of
// A–Z a–z 0–9 . _ @ -
func ValidPrincipal(s string) bool { return validName(s, 128, true) }

// validName reports whether s is 1 to most bytes of A–Z a–z 0–9 . _ -
// (and @ when at is set). It is checked on every reserve, byte by byte: a
// regular expression costs several times more.
func validName(s string, most int, at bool) bool {
	if len(s) < 1 || len(s) > most {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		case c == '@' && at:
		default:
			return false
		}
	}
	return true
}

// CheckPrincipal refuses a principal whose id is not valid.
func CheckPrincipal(p Principal) error {
	if !ValidPrincipal(p.ID) {
		return &outcome.InvalidInputError{Field: "principal", Reason: "not a valid principal id"}
	}
	return nil
}

// MaxStock bounds the stock, each restock and the total they add up to, so
// counters never approach overflow (and the total fits its Postgres column).
const MaxStock = db.MaxTotal

// CheckName checks a product's or a drop's name.
func CheckName(name string) error {
	if n := utf8.RuneCountInString(name); !utf8.ValidString(name) || n < 1 || n > 200 {
		return &outcome.InvalidInputError{Field: "name", Reason: "must be 1-200 characters of valid UTF-8"}
	}
	return nil
}

// CheckWindow checks that a sale window ends after it starts.
func CheckWindow(start, end *time.Time) error {
	if start != nil && end != nil && !start.IsZero() && !end.IsZero() && !end.After(*start) {
		return &outcome.InvalidInputError{Field: "saleEndsAt", Reason: "must be after saleStartsAt"}
	}
	return nil
}

// RequireAdmin refuses a principal who is not an admin.
func RequireAdmin(p Principal) error {
	if !p.Admin {
		return outcome.ErrForbidden
	}
	return nil
}

// FirstInvalid returns the first *InvalidInputError err holds, or err.
func FirstInvalid(err error) error {
	var inv *outcome.InvalidInputError
	if errors.As(err, &inv) {
		return inv
	}
	return err
}
