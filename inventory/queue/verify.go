package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// ErrNotVerified means a queue's pre-queue is not numbered as its seed says.
var ErrNotVerified = errors.New("the pre-queue's numbers are not the ones its seed gives")

// Verification is what VerifyPreQueue checked.
type Verification struct {
	SeedHash string
	// PreQueue is how many principals joined before the opening.
	PreQueue int
}

// VerifyPreQueue recomputes queue r's pre-queue order from its revealed
// seed (checked against the published SeedHash) and the principals numbered
// 1..pre, and compares it with the numbers they hold, in batches of
// StepMost. ErrNotVerified (wrapped, with the first difference) when they
// differ; an error when the queue has not opened yet.
func (s *Service) VerifyPreQueue(ctx context.Context, r Ref) (Verification, error) {
	q, err := s.ledger.Queues().Queue(ctx, r.String())
	if err != nil {
		return Verification{}, err
	}
	if q.Seed == nil {
		return Verification{}, fmt.Errorf("queue %s opens at %s: its seed is revealed only then", r, q.OpensAt)
	}
	k := keysOf(s.keys, r)
	st, err := s.rdb.HMGet(ctx, k.queue, "state", "pre").Result()
	if err != nil {
		return Verification{}, fmt.Errorf("reading queue %s: %w", r, err)
	}
	if st[0] != "open" {
		return Verification{}, fmt.Errorf("queue %s is not open yet (state %v)", r, st[0])
	}
	pre := int(toInt(st[1]))
	members := make([]string, 0, pre)
	for first := 1; first <= pre; first += s.cfg.StepMost {
		fields := make([]string, 0, s.cfg.StepMost)
		for n := first; n < first+s.cfg.StepMost && n <= pre; n++ {
			fields = append(fields, strconv.Itoa(n))
		}
		vals, err := s.rdb.HMGet(ctx, k.num, fields...).Result()
		if err != nil {
			return Verification{}, fmt.Errorf("reading queue %s: %w", r, err)
		}
		for i, v := range vals {
			who, ok := v.(string)
			if !ok {
				return Verification{}, fmt.Errorf("%w: number %s has no principal", ErrNotVerified, fields[i])
			}
			members = append(members, who)
		}
	}
	if err := CheckPreQueueOrder(q.Seed, q.SeedHash, members); err != nil {
		return Verification{}, err
	}
	return Verification{SeedHash: q.SeedHash, PreQueue: pre}, nil
}

// CheckPreQueueOrder is the verification itself: seed must hash to the
// published seedHash, and members (the principals holding numbers 1..n, in
// that order) must be the order PreQueueOrder recomputes from the seed.
// ErrNotVerified (wrapped, with the first difference) when they are not.
// VerifyPreQueue reads the members from Redis; a checker holding them from
// elsewhere (the ledger's numbers) calls it with those.
func CheckPreQueueOrder(seed []byte, seedHash string, members []string) error {
	h := sha256.Sum256(seed)
	if hex.EncodeToString(h[:]) != seedHash {
		return fmt.Errorf("%w: the seed does not hash to the published %s", ErrNotVerified, seedHash)
	}
	want := PreQueueOrder(seed, members)
	if len(want) != len(members) {
		return fmt.Errorf("%w: a principal holds two numbers", ErrNotVerified)
	}
	for i := range want {
		if want[i] != members[i] {
			return fmt.Errorf("%w: number %d is %s's, the seed gives it to %s", ErrNotVerified, i+1, members[i], want[i])
		}
	}
	return nil
}
