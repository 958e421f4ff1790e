package flashsale

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// Operations the driver measures.
const (
	OpReserve = "reserve"
	OpCommit  = "commit"
	OpCancel  = "cancel"
)

// Ops lists the measured operations in display order.
var Ops = []string{OpReserve, OpCommit, OpCancel}

// Sample is one HTTP request: which operation, when it started (seconds
// since the drop began), how long it took and what came back.
type Sample struct {
	Op      string        `json:"op"`
	T       float64       `json:"t"`
	Latency time.Duration `json:"latencyNs"`
	Code    string        `json:"code"`
}

// StockSample is one reading of the live stock during the drop.
type StockSample struct {
	T float64 `json:"t"`
	Stock
}

// recorder collects samples from every buyer goroutine.
type recorder struct {
	mu      sync.Mutex
	start   time.Time
	samples []Sample
}

func (r *recorder) add(op string, started time.Time, code string) {
	s := Sample{Op: op, T: started.Sub(r.start).Seconds(), Latency: time.Since(started), Code: code}
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.samples)
}

// OpStats summarises one operation over the whole drop.
type OpStats struct {
	Op        string         `json:"op"`
	Requests  int            `json:"requests"`
	PerSecond float64        `json:"perSecond"`
	P50ms     float64        `json:"p50Ms"`
	P95ms     float64        `json:"p95Ms"`
	P99ms     float64        `json:"p99Ms"`
	MaxMs     float64        `json:"maxMs"`
	Codes     map[string]int `json:"codes"`
}

// Summarise computes per-operation statistics over elapsed wall time.
func Summarise(samples []Sample, elapsed time.Duration) []OpStats {
	by := map[string][]Sample{}
	for _, s := range samples {
		by[s.Op] = append(by[s.Op], s)
	}
	var out []OpStats
	for _, op := range Ops {
		ss := by[op]
		if len(ss) == 0 {
			continue
		}
		lat := make([]time.Duration, len(ss))
		st := OpStats{Op: op, Requests: len(ss), Codes: map[string]int{}}
		for i, s := range ss {
			lat[i] = s.Latency
			st.Codes[s.Code]++
		}
		slices.Sort(lat)
		if elapsed > 0 {
			st.PerSecond = float64(len(ss)) / elapsed.Seconds()
		}
		st.P50ms = ms(Percentile(lat, 0.50))
		st.P95ms = ms(Percentile(lat, 0.95))
		st.P99ms = ms(Percentile(lat, 0.99))
		st.MaxMs = ms(lat[len(lat)-1])
		out = append(out, st)
	}
	return out
}

// Percentile returns the q-quantile (0..1) of sorted durations by the
// nearest-rank method; 0 for an empty slice.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

// sortedCodes returns the codes of m, most frequent first.
func sortedCodes(m map[string]int) []string {
	codes := make([]string, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool {
		if m[codes[i]] != m[codes[j]] {
			return m[codes[i]] > m[codes[j]]
		}
		return codes[i] < codes[j]
	})
	return codes
}
