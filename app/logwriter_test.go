package app

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/machine"
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

// BenchmarkAccessLogLine prices what batching saves: one access-log-sized
// info line, from many goroutines, into a pipe another process drains
// (stdout under a supervisor or a container runtime is a pipe), written a line at
// a time ("each") against through logWriter ("batched"). It reports the
// process's CPU per line, which is what the server pays beside a request.
func BenchmarkAccessLogLine(b *testing.B) {
	line := []byte(`{"level":"info","request_id":"d3f1c2a9b8e7","method":"POST","path":"/graphql","operation":"Reserve","status":200,"bytes":212,"duration_ms":0.812,"client":"127.0.0.1","time":"2026-12-06T07:30:00Z","message":"request"}` + "\n")
	for _, mode := range []string{"each", "batched"} {
		b.Run(mode, func(b *testing.B) {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			reader := exec.Command("cat") // another process, as a log collector is
			reader.Stdin = r
			if err := reader.Start(); err != nil {
				b.Fatal(err)
			}
			var out zerolog.LevelWriter = zerolog.LevelWriterAdapter{Writer: w}
			var lw *logWriter
			if mode == "batched" {
				lw = newLogWriter(w, logFlushInterval, logFlushBytes)
				out = lw
			}
			cpu := machine.SelfCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, _ = out.WriteLevel(zerolog.InfoLevel, line)
				}
			})
			if lw != nil {
				_ = lw.Close()
			}
			b.StopTimer()
			b.ReportMetric(float64(machine.SelfCPU()-cpu)/float64(b.N), "cpu-ns/line")
			_ = w.Close()
			_ = reader.Wait()
			_ = r.Close()
		})
	}
}
