package testsignal_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testsignal"
)

func TestSignal(t *testing.T) {
	var s testsignal.Signal[int]
	s.Signal(1) // before Init: nothing, and no block

	s.Init()
	for i := range 2000 { // more than it keeps: the oldest go, the sender never blocks
		s.Signal(i)
	}
	require.Equal(t, 2000-1024, s.Wait(t, time.Second), "the oldest kept value comes first")
	s.WaitFor(t, time.Second, "the last value", func(v int) bool { return v == 1999 })
	select {
	case v := <-s.C():
		t.Fatalf("nothing left to read, got %d", v)
	default:
	}
}
