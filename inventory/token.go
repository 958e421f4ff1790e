package inventory

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strconv"

	"github.com/dropline/dropline/inventory/core"
)

// tokenEncoding is lowercase base32 without padding: URL-safe and easy to read aloud.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// tokenLen is a kind letter + two partition digits + "." + 26 characters of
// 128 random bits.
const tokenLen = 1 + 2 + 1 + 26

// The kinds of token, their first letter: a reservation made by reserve, a
// reservation that is a line of a cart, and a cart.
const (
	tokenHold = 'r'
	tokenLine = 'l'
	tokenCart = 'c'
)

// newToken returns an unguessable reservation token that names its partition,
// so a commit or cancel finds the hold without a lookup.
func newToken(partition int) string { return newTokenOf(tokenHold, partition) }

func newTokenOf(kind byte, partition int) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the OS has no entropy: nothing is safe
	}
	var t [tokenLen]byte
	t[0], t[1], t[2], t[3] = kind, byte('0'+partition/10), byte('0'+partition%10), '.'
	tokenEncoding.Encode(t[4:], b[:])
	return string(t[:])
}

// parseToken checks a reservation token's shape (a hold's or a cart line's)
// and returns its partition. A malformed token is an InvalidInputError; a
// well-formed unknown one is found missing later.
func parseToken(token string) (int, error) {
	if len(token) == tokenLen && token[0] == tokenLine {
		return parseTokenOf(tokenLine, token, "not a reservation token")
	}
	return parseTokenOf(tokenHold, token, "not a reservation token")
}

// parseCartToken checks a cart token's shape and returns its home partition.
func parseCartToken(token string) (int, error) {
	return parseTokenOf(tokenCart, token, "not a cart token")
}

// isCartLine reports whether a reservation token names a line of a cart.
func isCartLine(token string) bool { return len(token) == tokenLen && token[0] == tokenLine }

func parseTokenOf(kind byte, token, reason string) (int, error) {
	if len(token) != tokenLen || token[0] != kind || token[3] != '.' {
		return 0, &InvalidInputError{Field: "token", Reason: reason}
	}
	p, err := strconv.Atoi(token[1:3])
	if err != nil || p < 0 || p >= Partitions {
		return 0, &InvalidInputError{Field: "token", Reason: reason}
	}
	if b, err := tokenEncoding.DecodeString(token[4:]); err != nil || len(b) != 16 {
		return 0, &InvalidInputError{Field: "token", Reason: reason}
	}
	return p, nil
}

func newNonce() string { return core.NewNonce() }
