package app

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

// Every line logged before Close is written by the end of Close, each
// whole and once, from many goroutines at once, and in far fewer writes
// than lines.
func TestLogWriterWritesEveryLineByClose(t *testing.T) {
	out := &testenv.LogBuffer{}
	// An interval no test waits for: only the size bound and Close write.
	w := newLogWriter(out, time.Hour, 4<<10)
	log := zerolog.New(w)
	const goroutines, lines = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range lines {
				log.Info().Int("g", g).Int("i", i).Msg("request")
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())

	seen := map[string]int{}
	for line := range strings.SplitSeq(strings.TrimSuffix(out.String(), "\n"), "\n") {
		seen[line]++
	}
	require.Equal(t, goroutines*lines, len(seen), "a line is missing or was cut")
	for g := range goroutines {
		for i := range lines {
			line := `{"level":"info","g":` + strconv.Itoa(g) + `,"i":` + strconv.Itoa(i) + `,"message":"request"}`
			require.Equal(t, 1, seen[line], line)
		}
	}
	require.Less(t, out.Writes(), goroutines*lines/10)

	// After Close a line goes out at once.
	log.Info().Msg("after close")
	require.True(t, strings.HasSuffix(out.String(), `{"level":"info","message":"after close"}`+"\n"))
}

// A warning is written at once, after the lines that waited before it;
// the interval writes a line nobody follows.
func TestLogWriterWritesWarningsAtOnceAndTheRestWithinTheInterval(t *testing.T) {
	// An interval no test waits for: that the info line waits cannot
	// depend on how soon this goroutine runs again.
	out := &testenv.LogBuffer{}
	w := newLogWriter(out, time.Hour, 64<<10)
	log := zerolog.New(w)
	log.Info().Msg("first")
	require.Empty(t, out.String(), "an info line waits")
	log.Warn().Msg("second")
	require.Equal(t, `{"level":"info","message":"first"}`+"\n"+`{"level":"warn","message":"second"}`+"\n", out.String())
	require.NoError(t, w.Close())

	out = &testenv.LogBuffer{}
	w = newLogWriter(out, 20*time.Millisecond, 64<<10)
	log = zerolog.New(w)
	log.Info().Msg("third")
	require.Eventually(t, func() bool {
		return out.String() == `{"level":"info","message":"third"}`+"\n"
	}, 5*time.Second, 5*time.Millisecond, "the interval wrote nothing")
	require.NoError(t, w.Close())
	require.Equal(t, 1, strings.Count(out.String(), "\n"))
}
