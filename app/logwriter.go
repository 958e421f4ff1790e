package app

import (
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Bounds of the log's buffer: a line waits at most logFlushInterval, and the
// buffer is written out as soon as it holds logFlushBytes.
const (
	logFlushInterval = 100 * time.Millisecond
	logFlushBytes    = 64 << 10
)

// logWriter is the root logger's output in JSON format: lines below warn
// (the access log's, one per request) are gathered in a buffer and written
// with one write every logFlushInterval, or sooner when logFlushBytes are
// waiting, instead of one write per line. A line at warn or above is
// written at once, after the lines before it, so nothing that explains a
// failure waits. Close writes what is left; after it every line is written
// at once. What a crash loses (the process killed, or a panic nothing
// recovers) is the info and debug lines of its last interval.
type logWriter struct {
	out      io.Writer
	interval time.Duration
	limit    int

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer
	closed bool
}

var _ zerolog.LevelWriter = (*logWriter)(nil)

func newLogWriter(out io.Writer, interval time.Duration, limit int) *logWriter {
	return &logWriter{out: out, interval: interval, limit: limit}
}

// Write takes a line whose level is not known: it waits like an info line.
func (w *logWriter) Write(p []byte) (int, error) {
	return w.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel buffers a line below warn and writes any other at once, with
// what was waiting before it.
func (w *logWriter) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || (l >= zerolog.WarnLevel && l != zerolog.NoLevel) {
		w.flushLocked()
		return w.out.Write(p)
	}
	w.buf = append(w.buf, p...)
	switch {
	case len(w.buf) >= w.limit:
		w.flushLocked()
	case w.timer == nil:
		w.timer = time.AfterFunc(w.interval, w.Flush)
	}
	return len(p), nil
}

// Flush writes what is waiting.
func (w *logWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
}

func (w *logWriter) flushLocked() {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if len(w.buf) == 0 {
		return
	}
	_, _ = w.out.Write(w.buf) // a log that cannot be written has no one to tell
	if cap(w.buf) > 4*w.limit {
		w.buf = nil // one burst of huge lines does not keep its memory
	} else {
		w.buf = w.buf[:0]
	}
}

// Close writes what is waiting and makes every later line go out at once.
func (w *logWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	w.closed = true
	return nil
}
