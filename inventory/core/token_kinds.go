package core

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// tokenEncoding is lowercase base32 without padding: URL-safe and easy to read aloud.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// TokenLen is a kind letter + two partition digits + "." + 26 characters of
// 128 bits: the second the token was made, then 96 random bits.
const TokenLen = 1 + 2 + 1 + 26

// The kinds of token, their first letter: a reservation made by reserve, a
// reservation that is a line of a cart, and a cart.
const (
	TokenHold = 'r'
	TokenLine = 'l'
	TokenCart = 'c'
)

// NewToken returns an unguessable reservation token that names its partition,
// so a commit or cancel finds the hold without a lookup.
func NewToken(partition int) string { return NewTokenOf(TokenHold, partition) }

// NewTokenOf returns an unguessable token of a kind (TokenHold, TokenLine,
// TokenCart) that names its partition.
//
// Its 16 bytes are the second it was made (Unix time, 4 bytes big-endian)
// and 96 random bits, which no one guesses either. The time goes first so
// that tokens made close together share their first characters: the
// ledger's indexes keyed by token (reservations' primary key, the event ids
// of stock_movements) then take a second's new rows in a few neighbouring
// pages rather than one page each anywhere in the index, which, once the
// ledger is larger than PostgreSQL's buffers, is a third or more of what
// the write-behind costs PostgreSQL per event (docs/benchmarks.md). Tokens
// of 128 random bits, made before, are still read as they were.
func NewTokenOf(kind byte, partition int) string {
	return newTokenAt(kind, partition, time.Now())
}

func newTokenAt(kind byte, partition int, now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint32(b[:4], uint32(now.Unix())) //nolint:gosec // wraps in 2106, which only moves the clusters
	if _, err := rand.Read(b[4:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the OS has no entropy: nothing is safe
	}
	var t [TokenLen]byte
	t[0], t[1], t[2], t[3] = kind, byte('0'+partition/10), byte('0'+partition%10), '.'
	tokenEncoding.Encode(t[4:], b[:])
	return string(t[:])
}

// ParseToken checks a reservation token's shape (a hold's or a cart line's)
// and returns its partition. A malformed token is an InvalidInputError; a
// well-formed unknown one is found missing later.
func ParseToken(token string) (int, error) {
	if len(token) == TokenLen && token[0] == TokenLine {
		return parseTokenOf(TokenLine, token, "not a reservation token")
	}
	return parseTokenOf(TokenHold, token, "not a reservation token")
}

// ParseCartToken checks a cart token's shape and returns its home partition.
func ParseCartToken(token string) (int, error) {
	return parseTokenOf(TokenCart, token, "not a cart token")
}

// IsCartLine reports whether a reservation token names a line of a cart.
func IsCartLine(token string) bool { return len(token) == TokenLen && token[0] == TokenLine }

func parseTokenOf(kind byte, token, reason string) (int, error) {
	if len(token) != TokenLen || token[0] != kind || token[3] != '.' {
		return 0, &outcome.InvalidInputError{Field: "token", Reason: reason}
	}
	p, err := strconv.Atoi(token[1:3])
	if err != nil || p < 0 || p >= script.Partitions {
		return 0, &outcome.InvalidInputError{Field: "token", Reason: reason}
	}
	if b, err := tokenEncoding.DecodeString(token[4:]); err != nil || len(b) != 16 {
		return 0, &outcome.InvalidInputError{Field: "token", Reason: reason}
	}
	return p, nil
}
