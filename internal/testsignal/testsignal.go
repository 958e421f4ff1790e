// Package testsignal lets a test wait for something a background loop did
// (a sweep, a batch applied, a lease taken) instead of polling for its
// effects.
//
// A Signal's zero value does nothing when signalled, so production code pays
// one nil check. A test calls Init before the loop starts, then Wait or
// WaitFor to block until the loop has signalled.
package testsignal

import (
	"testing"
	"time"
)

// size bounds the values a Signal keeps unread; beyond it the oldest go. A
// loop that counts therefore signals its running total, which a later value
// carries on, rather than each step's share.
const size = 1024

// Signal carries values of T from a loop to a test.
type Signal[T any] struct {
	ch chan T
}

// Init makes the signal deliver; call it before the loop that signals
// starts. Tests only.
func (s *Signal[T]) Init() { s.ch = make(chan T, size) }

// Signal sends v to a test waiting on the signal, without ever blocking. It
// does nothing before Init.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	for {
		select {
		case s.ch <- v:
			return
		default:
		}
		select { // full: make room by dropping the oldest
		case <-s.ch:
		default:
		}
	}
}

// C is the channel the values arrive on, for a test that waits on several
// signals at once. Tests only.
func (s *Signal[T]) C() <-chan T {
	if s.ch == nil {
		panic("testsignal: C before Init")
	}
	return s.ch
}

// Wait returns the next value, failing the test after timeout.
func (s *Signal[T]) Wait(t testing.TB, timeout time.Duration) T {
	t.Helper()
	if s.ch == nil {
		panic("testsignal: Wait before Init")
	}
	select {
	case v := <-s.ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for a test signal", timeout)
	}
	var zero T
	return zero
}

// WaitFor reads values until done says they are enough, failing the test,
// with what, when timeout passes first.
func (s *Signal[T]) WaitFor(t testing.TB, timeout time.Duration, what string, done func(T) bool) {
	t.Helper()
	if s.ch == nil {
		panic("testsignal: WaitFor before Init")
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case v := <-s.ch:
			if done(v) {
				return
			}
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
	}
}
