package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The versions of what this binary keeps in Redis, so that two adjacent
// releases can share one Redis during a rolling upgrade (docs/operations.md,
// Upgrades).
//
// LayoutVersion is the version of the key layout and of the hashes, sets and
// streams under it (doc.go's Key layout) that this binary writes. A release
// bumps it when it writes something an earlier release would misread: a key
// renamed or moved, a field whose meaning changes, a hash turned into a set.
// Adding a field that readers ignore, or a key the earlier release never
// looks at, does not bump it.
//
// LayoutCompatible is the oldest layout this binary can run beside: read
// what a binary of that layout writes, and write nothing that binary
// misreads. A release that bumps LayoutVersion keeps LayoutCompatible at the
// previous layout for one release (it reads both, and writes only what both
// read), so the two can run together; the next release may raise it.
const (
	LayoutVersion    = 1
	LayoutCompatible = 1
)

// EventVersion is the version of the outbox entries this binary writes and
// the newest it reads, in each entry's "v" field, except that an entry of
// version 1 carries none: every reader takes an entry without "v" as
// version 1 (releases from before the field wrote none either), so the
// scripts leave out a field that would cost every XADD and every read
// (lib.lua's emit_event). A release that bumps it writes "v" in every
// entry again. A new field that readers may ignore does not
// bump it; a field whose meaning changes, or one a reader must not ignore,
// does. The release that bumps it must read both versions and is deployed
// writing the old one; only once no older reader runs does the next
// release write the new one (docs/operations.md, Upgrades). A reader that
// meets a newer version refuses the entry (ErrNewerEvent): the write-behind
// moves it to the dead letters, from where it is put back once a release
// that reads it runs.
const EventVersion = 1

// ErrNewerEvent means an outbox entry carries an EventVersion newer than
// this binary reads: a newer release wrote it.
var ErrNewerEvent = errors.New("outbox entry of a newer version")

// ErrLayout means Redis holds data of a layout this binary cannot run
// beside; the message says which and what to do.
var ErrLayout = errors.New("incompatible Redis layout")

// Layout is what the Redis layout record (Keys.Layout) says: the newest
// layout written into this key prefix, and the oldest layout a binary must
// run to read it.
type Layout struct {
	Version    int
	Compatible int
}

// checkLayout decides whether this binary may use the Redis under its
// prefix, and records its own layout when it is the newer one:
//
//   - no record: this binary's layout is recorded (data written by a release
//     from before the record is of layout 1);
//   - a record of this binary's layout: nothing to do;
//   - a newer layout: this binary runs only if the record's compat is at
//     most LayoutVersion (the newer release said it can run beside this
//     one); the record is left alone;
//   - an older layout: this binary runs only if it reads that layout
//     (LayoutCompatible at most the record's), and records its own.
//
// The record is read and written in one optimistic transaction, so two
// instances starting at once do not undo each other.
func checkLayout(ctx context.Context, rdb redis.UniversalClient, keys Keys) error {
	key := keys.Layout()
	var last error
	for range 10 {
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			vals, err := tx.HMGet(ctx, key, "layout", "compat").Result()
			if err != nil {
				return err
			}
			if vals[0] != nil {
				var have Layout
				s0, _ := vals[0].(string)
				s1, _ := vals[1].(string)
				v, err0 := strconv.Atoi(s0)
				c, err1 := strconv.Atoi(s1)
				if err0 != nil || err1 != nil {
					return fmt.Errorf("%w: the record %s is malformed (layout %q, compat %q); delete it if nothing but this release uses this prefix", ErrLayout, key, s0, s1)
				}
				have = Layout{Version: v, Compatible: c}
				if err := layoutAllows(key, have); err != nil {
					return err
				}
				if have.Version >= LayoutVersion {
					return nil
				}
			}
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.HSet(ctx, key, "layout", LayoutVersion, "compat", LayoutCompatible)
				return nil
			})
			return err
		}, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil && !errors.Is(err, ErrLayout) {
			// A connection lost at start (a failover, a restart) is asked
			// again, like every other read at start.
			last = fmt.Errorf("checking the Redis layout record %s: %w", key, err)
			select {
			case <-ctx.Done():
				return last
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		return err
	}
	if last != nil {
		return last
	}
	return fmt.Errorf("checking the Redis layout record %s: it kept changing", key)
}

// layoutAllows says why this binary cannot run beside Redis data of layout
// have, or nil when it can.
func layoutAllows(key string, have Layout) error {
	switch {
	case have.Version > LayoutVersion && have.Compatible > LayoutVersion:
		return fmt.Errorf("%w: Redis (%s) holds layout %d, written by a newer Dropline that cannot run beside this one "+
			"(it needs layout %d or later; this release writes layout %d): run that newer release, "+
			"or see Upgrades in docs/operations.md to roll back", ErrLayout, key, have.Version, have.Compatible, LayoutVersion)
	case have.Version < LayoutCompatible:
		return fmt.Errorf("%w: Redis (%s) holds layout %d, and this release reads layouts %d to %d: "+
			"upgrade through a release that reads layout %d first (see Upgrades in docs/operations.md)", ErrLayout, key, have.Version, LayoutCompatible, LayoutVersion, have.Version)
	}
	return nil
}
