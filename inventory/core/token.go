package core

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// NewNonce returns 128 random bits in hex for a script that may hand units
// to waiters: the tokens of the holds it makes are derived from it (see
// offer_token in lua/lib.lua), so they are as unguessable as the engine's tokens, and
// a script the client repeats with the same arguments makes the same ones.
func NewNonce() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}
