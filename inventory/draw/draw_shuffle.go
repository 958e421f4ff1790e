package draw

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"

	"github.com/dropline/dropline/inventory/policy"
)

// The draw's shuffle, exactly as docs/design.md (G14) spells it out so that
// anyone can recompute a draw from its revealed seed and its entries:
//
//  1. The entries are sorted by their id, ascending: e[0], ..., e[n-1].
//  2. A stream of 64-bit numbers comes from the seed: the k-th (k = 0, 1,
//     2, ...) is the first 8 bytes, big-endian, of HMAC-SHA256(key = seed,
//     message = k as 8 bytes big-endian).
//  3. Fisher–Yates: for i from n-1 down to 1, take the next number r of the
//     stream, rejecting (and taking the next) while r >= 2^64 - (2^64 mod
//     (i+1)), so that every j is equally likely; j = r mod (i+1); swap e[i]
//     and e[j]. The shuffled order is e[0], ..., e[n-1] after the loop.
//  4. Walking the shuffled order with the units the draw gives out, an entry
//     whose quantity fits what is left wins and takes its units; one that
//     does not fit loses, and the walk goes on. Every entry after the stock is
//     used up loses. Place is the position in the shuffled order, from 1.

// drawStream is the seeded stream of step 2.
type drawStream struct {
	mac hashFunc
	k   uint64
}

type hashFunc interface {
	Write([]byte) (int, error)
	Sum([]byte) []byte
	Reset()
}

func (s *drawStream) next() uint64 {
	var msg [8]byte
	binary.BigEndian.PutUint64(msg[:], s.k)
	s.k++
	s.mac.Reset()
	_, _ = s.mac.Write(msg[:])
	return binary.BigEndian.Uint64(s.mac.Sum(nil)[:8])
}

// below returns a uniform number in [0, n), by rejection (step 3).
func (s *drawStream) below(n uint64) uint64 {
	// 2^64 mod n, computed without 2^64: (2^64 - n) mod n.
	rem := (-n) % n
	limit := ^uint64(0) - rem // the largest accepted r is 2^64 - rem - 1
	for {
		r := s.next()
		if rem == 0 || r <= limit {
			return r % n
		}
	}
}

// Order returns the shuffled order of n entries sorted by id: order[p]
// is the index (in id order) of the entry at place p+1.
func Order(seed []byte, n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	s := &drawStream{mac: hmac.New(sha256.New, seed)}
	for i := n - 1; i >= 1; i-- {
		j := int(s.below(uint64(i + 1)))
		order[i], order[j] = order[j], order[i]
	}
	return order
}

// Winners applies step 4: quantities are the entries' in id order, stock
// the units given out. It returns the order (as Order) and, per entry in
// id order, whether it won. Whether an entry's quantity fits what is left is
// the policy's decision on the draw's path (policy.Check), the one
// apply_draw.lua asks again of what Redis has when it gives the winner its
// hold.
func Winners(seed []byte, stock int, quantities []int) (order []int, won []bool) {
	order = Order(seed, len(quantities))
	won = make([]bool, len(quantities))
	left := stock
	for _, i := range order {
		if left == 0 {
			break
		}
		if policy.Check(policy.Draw, policy.DrawResult, policy.State{Free: left, Qty: quantities[i]}) == nil {
			won[i] = true
			left -= quantities[i]
		}
	}
	return order, won
}
