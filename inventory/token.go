package inventory

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strconv"
)

// tokenEncoding is lowercase base32 without padding: URL-safe and easy to read aloud.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// tokenLen is "r" + two partition digits + "." + 26 characters of 128 random bits.
const tokenLen = 1 + 2 + 1 + 26

// newToken returns an unguessable reservation token that names its partition,
// so a commit or cancel finds the hold without a lookup.
func newToken(partition int) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the OS has no entropy: nothing is safe
	}
	return fmt.Sprintf("r%02d.%s", partition, tokenEncoding.EncodeToString(b[:]))
}

// parseToken checks a token's shape and returns its partition. A malformed
// token is an InvalidInputError; a well-formed unknown one is found missing later.
func parseToken(token string) (int, error) {
	if len(token) != tokenLen || token[0] != 'r' || token[3] != '.' {
		return 0, &InvalidInputError{Field: "token", Reason: "not a reservation token"}
	}
	p, err := strconv.Atoi(token[1:3])
	if err != nil || p < 0 || p >= Partitions {
		return 0, &InvalidInputError{Field: "token", Reason: "not a reservation token"}
	}
	if b, err := tokenEncoding.DecodeString(token[4:]); err != nil || len(b) != 16 {
		return 0, &InvalidInputError{Field: "token", Reason: "not a reservation token"}
	}
	return p, nil
}

// newNonce returns 128 random bits in hex for a script that may hand units
// to waiters: the tokens of the holds it makes are derived from it (see
// offer_token in lua/lib.lua), so they are as unguessable as newToken's, and
// a script the client repeats with the same arguments makes the same ones.
func newNonce() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}
