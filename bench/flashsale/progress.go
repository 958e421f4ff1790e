package flashsale

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// ProgressState is what the progress bar shows.
type ProgressState struct {
	Done, Total int
	Elapsed     time.Duration
	Stock       Stock
}

// ProgressSink receives progress while a drop runs (from one goroutine).
type ProgressSink interface {
	Update(ProgressState)
	Finish()
}

// Bar is a one-line progress bar of our own: on a terminal it redraws in
// place; elsewhere (CI logs) it prints a plain line every two seconds so
// the log stays readable. Not worth a dependency.
type Bar struct {
	W        io.Writer
	Terminal bool
	last     time.Time
	lastLine string
	pending  *ProgressState
}

// Update draws the bar.
func (b *Bar) Update(p ProgressState) {
	if !b.Terminal && time.Since(b.last) < 2*time.Second {
		b.pending = &p
		return
	}
	b.last, b.pending = time.Now(), nil
	const width = 30
	filled := 0
	if p.Total > 0 {
		filled = width * p.Done / p.Total
	}
	line := fmt.Sprintf("[%s%s] %d/%d buyers  %5.1fs  stock: available %d held %d sold %d of %d",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Done, p.Total, p.Elapsed.Seconds(),
		p.Stock.Available, p.Stock.Held, p.Stock.Sold, p.Stock.Total)
	b.lastLine = line
	if b.Terminal {
		fmt.Fprintf(b.W, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(b.W, line)
	}
}

// Finish shows the last state and ends the line.
func (b *Bar) Finish() {
	if p := b.pending; p != nil {
		b.last = time.Time{}
		b.Update(*p)
	}
	if b.Terminal && b.lastLine != "" {
		fmt.Fprintln(b.W)
	}
}
