package core

import (
	"crypto/rand"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/outcome"
)

// QueueSettings put a product, or a drop, behind an admission queue
// (package inventory/queue): before OpensAt joiners enter a pre-queue,
// shuffled at OpensAt from a seed whose SHA-256 is public from creation;
// tickets are admitted in order at AdmitPerMinute, never so many that unspent
// passes outnumber the units available; a reserve, cart line or waitlist
// join then needs the pass (policy.Queue).
type QueueSettings struct {
	OpensAt        time.Time
	AdmitPerMinute int
	// PassLife is how long a pass stays valid; 0 means DefaultPassLife.
	PassLife time.Duration
	// ProofOfWorkBits, when above 0, asks each join for a hashcash proof
	// of that many leading zero bits.
	ProofOfWorkBits int
	// AccessCodes, when set, are presale codes: each join brings one, and
	// each is used by one principal.
	AccessCodes []string
}

// The bounds of a queue's settings.
const (
	DefaultPassLife    = 120 * time.Second
	MinPassLife        = 10 * time.Second
	MaxPassLife        = time.Hour
	MaxAdmitPerMinute  = 1_000_000
	MaxProofOfWorkBits = 32
	MaxAccessCodes     = 100_000
)

// NewQueue checks a queue's settings and draws its seed; field is the
// input's name for the settings ("queue").
func NewQueue(q *QueueSettings, field string) (*db.NewQueue, error) {
	if q == nil {
		return nil, nil
	}
	life := q.PassLife
	if life == 0 {
		life = DefaultPassLife
	}
	switch {
	case q.OpensAt.IsZero():
		return nil, &outcome.InvalidInputError{Field: field + ".opensAt", Reason: "is required"}
	case q.AdmitPerMinute < 1 || q.AdmitPerMinute > MaxAdmitPerMinute:
		return nil, &outcome.InvalidInputError{Field: field + ".admitPerMinute", Reason: fmt.Sprintf("must be between 1 and %d", MaxAdmitPerMinute)}
	case life < MinPassLife || life > MaxPassLife || life%time.Second != 0:
		return nil, &outcome.InvalidInputError{Field: field + ".passSeconds", Reason: fmt.Sprintf("must be between %d and %d",
			int(MinPassLife.Seconds()), int(MaxPassLife.Seconds()))}
	case q.ProofOfWorkBits < 0 || q.ProofOfWorkBits > MaxProofOfWorkBits:
		return nil, &outcome.InvalidInputError{Field: field + ".proofOfWorkBits", Reason: fmt.Sprintf("must be between 0 and %d", MaxProofOfWorkBits)}
	case len(q.AccessCodes) > MaxAccessCodes:
		return nil, &outcome.InvalidInputError{Field: field + ".accessCodes", Reason: fmt.Sprintf("at most %d", MaxAccessCodes)}
	}
	for _, c := range q.AccessCodes {
		if c == "" || len(c) > 128 {
			return nil, &outcome.InvalidInputError{Field: field + ".accessCodes", Reason: "each must be 1-128 bytes"}
		}
	}
	seed := make([]byte, 32)
	if _, err := rand.Read(seed); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return &db.NewQueue{OpensAt: q.OpensAt, AdmitPerMinute: q.AdmitPerMinute, PassSeconds: int(life / time.Second),
		ProofOfWorkBits: q.ProofOfWorkBits, Seed: seed, AccessCodes: q.AccessCodes}, nil
}
