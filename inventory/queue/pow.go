package queue

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Challenge is a proof-of-work puzzle for one principal and one queue: find
// a Proof such that SHA-256(Challenge + ":" + Proof) starts with Bits zero
// bits. It is signed (HMAC-SHA256 with the service's secret) and carries its
// principal, queue and expiry, so any instance verifies it without state.
type Challenge struct {
	Challenge string
	Bits      int
	ExpiresAt time.Time
}

// challengePayload is what a challenge signs.
func challengePayload(r Ref, principal string, bits int, exp time.Time) string {
	return r.String() + "|" + principal + "|" + strconv.Itoa(bits) + "|" + strconv.FormatInt(exp.Unix(), 10)
}

func sign(secret []byte, payload string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func newChallenge(secret []byte, r Ref, principal string, bits int, exp time.Time) Challenge {
	p := challengePayload(r, principal, bits, exp)
	return Challenge{Challenge: base64.RawURLEncoding.EncodeToString([]byte(p)) + "." + sign(secret, p), Bits: bits, ExpiresAt: exp}
}

// verifyProof reports whether proof solves a live challenge of principal
// for queue r with at least bits zero bits.
func verifyProof(secret []byte, r Ref, principal string, bits int, challenge, proof string, now time.Time) bool {
	enc, mac, ok := strings.Cut(challenge, ".")
	if !ok || len(proof) == 0 || len(proof) > 64 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || !hmac.Equal([]byte(sign(secret, string(raw))), []byte(mac)) {
		return false
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 4 || parts[0] != r.String() || parts[1] != principal {
		return false
	}
	n, err1 := strconv.Atoi(parts[2])
	exp, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil || n < bits || now.Unix() >= exp {
		return false
	}
	return LeadingZeroBits(challenge, proof) >= bits
}

// LeadingZeroBits is how many zero bits SHA-256(challenge + ":" + proof)
// starts with: a client's proof has at least a challenge's Bits.
func LeadingZeroBits(challenge, proof string) int {
	h := sha256.Sum256([]byte(challenge + ":" + proof))
	z := 0
	for i := 0; i < len(h); i += 8 {
		w := binary.BigEndian.Uint64(h[i : i+8])
		if w != 0 {
			return z + bits.LeadingZeros64(w)
		}
		z += 64
	}
	return z
}

// Solve finds a proof for a challenge, as a client would: the first counter
// whose hash has enough zero bits (about 2^bits tries).
func Solve(c Challenge) string {
	for i := 0; ; i++ {
		p := strconv.Itoa(i)
		if LeadingZeroBits(c.Challenge, p) >= c.Bits {
			return p
		}
	}
}
