package flashsale

import (
	"bytes"
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// WriteHTML writes a self-contained report: inline CSS and SVG charts we
// draw ourselves, no script and no network, so it opens offline and can be
// attached to a ticket as one file.
func WriteHTML(w io.Writer, r *Result) error {
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		return err
	}
	status := "PASS"
	if !r.Verdict.OK {
		status = "FAIL"
	}
	// The charts are SVG we generate; every string in them that comes from
	// data (series names, labels) goes through html.EscapeString.
	data := map[string]any{
		"R":        r,
		"Status":   status,
		"Summary":  text.String(),
		"Stock":    template.HTML(stockChart(r.Stock)),                       //nolint:gosec // escaped above
		"Latency":  template.HTML(latencyCharts(r.Samples)),                  //nolint:gosec // escaped above
		"Outcomes": template.HTML(outcomeChart(r.Samples, r.ElapsedSeconds)), //nolint:gosec // escaped above
		"Watch":    template.HTML(watchChart(r.Watch)),                       //nolint:gosec // escaped above
		"When":     r.StartedAt.UTC().Format(time.RFC3339),
	}
	return reportTmpl.Execute(w, data)
}

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Dropline flash sale {{.R.SKU}} — {{.Status}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:2em}
.PASS{color:#17803d} .FAIL{color:#c0262d}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
svg{background:#fff;border:1px solid #ddd;margin:.5em 0}
svg text{font:11px system-ui,sans-serif;fill:#444}
</style></head><body>
<h1>Flash sale {{.R.SKU}}: <span class="{{.Status}}">{{.Status}}</span></h1>
<p>Run {{.R.RunID}} started {{.When}}; {{.R.Buyers}} buyers, concurrency {{.R.Concurrency}},
oversold <b>{{.R.Verdict.Oversold}}</b>, sold {{.R.Verdict.SoldUnits}}, held {{.R.Verdict.HeldUnits}}.</p>
<h2>Stock over time</h2>{{.Stock}}
<h2>Latency histogram</h2>{{.Latency}}
{{with .R.Watch}}<h2>Live watchers</h2>
<p>{{.Connected}} of {{.Watchers}} {{.Transport}} watchers of {{.SKUs}} SKU(s) from {{.SourceAddrs}} source addresses;
{{.Changes}} changes at {{.ChangeRate}}/s. Change to watcher: p50 <b>{{.Latency.P50ms}} ms</b>, p90 {{.Latency.P90ms}} ms,
p99 <b>{{.Latency.P99ms}} ms</b>, max {{.Latency.MaxMs}} ms ({{.Deliveries}} deliveries, {{.Missing}} missing);
slowest watcher per change p99 {{.ToAll.P99ms}} ms, fastest p99 {{.ToFirst.P99ms}} ms;
CPU per change: server {{printf "%.1f" .ServerCPUPerChangeMs}} ms, driver {{printf "%.1f" .DriverCPUPerChangeMs}} ms. Converged after the drop: <b>{{.Converged}} of {{.Connected}}</b>.
Server memory per idle watcher: <b>{{printf "%.1f" .RSSPerWatcherKiB}} KiB</b>, {{printf "%.1f" .GoroutinesPerConn}} goroutines.
Load average during the changes: {{.LoadAvg}}.</p>
{{end}}{{if .R.Watch}}{{.Watch}}{{end}}
{{with .R.Draw}}<h2>Draw rehearsal</h2>
<p>SKU {{.SKU}}: {{.Stock}} units, {{.Entrants}} entrants ({{.Replays}} entered twice) in {{printf "%.2f" .EnterSeconds}} s.
Drawn: {{.Entries}} entries, <b>{{.Winners}} won</b> ({{.WonUnits}} units), {{.Losers}} lost; every buyer saw the result
{{printf "%.2f" .DrawSeconds}} s after closesAt. Seed hash {{.SeedHash}}.{{if .Verification}} {{.Verification}}{{end}}</p>
{{end}}{{with .R.Queue}}<h2>Queue rehearsal</h2>
<p>SKU {{.SKU}}: {{.Stock}} units behind a queue, {{.Servers}} servers; {{.People}} people ({{.Pollers}} polling) and {{.Bots}} bots
({{.BotConns}} connections each); {{.Early}} joined the pre-queue, {{.Late}} after the opening. Sold in {{printf "%.2f" .SellSeconds}} s:
people <b>{{.PeopleUnits}}</b> units, bots <b>{{.BotUnits}}</b> (at most {{printf "%.1f" .BotBound}} allowed).
SOLD_OUT reached {{.Told}} of {{.Watching}} websocket waiters, at most {{.SoldOutLate.MaxMs}} ms after the last sale.
{{if .Verification}} {{.Verification}}{{end}}</p>
{{end}}<h2>Outcomes over time</h2>{{.Outcomes}}
<h2>Summary</h2><pre>{{.Summary}}</pre>
</body></html>
`))

// series is one line of a chart.
type series struct {
	Name   string
	Color  string
	Dashed bool
	Y      []float64
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

const (
	chartW, chartH                 = 960, 300
	padL, padR, padT, padB         = 60, 170, 20, 40
	plotW                  float64 = chartW - padL - padR
	plotH                  float64 = chartH - padT - padB
)

// lineChart draws series over xs with linear axes and a legend. xTick, when
// set, labels the x axis (which then ends exactly at the last x).
func lineChart(xs []float64, ss []series, xLabel, yLabel string, xTick func(float64) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`, chartW, chartH, chartW, chartH)
	if len(xs) == 0 {
		b.WriteString(`<text x="20" y="30">no data</text></svg>`)
		return b.String()
	}
	xMax, yMax := xs[len(xs)-1], 0.0
	for _, s := range ss {
		for _, y := range s.Y {
			yMax = math.Max(yMax, y)
		}
	}
	if xTick == nil {
		xMax, xTick = niceCeil(xMax), tick
	}
	xMax, yMax = math.Max(xMax, 1e-9), niceCeil(yMax)
	px := func(x float64) float64 { return padL + x/xMax*plotW }
	py := func(y float64) float64 { return padT + plotH - y/yMax*plotH }
	axes(&b, xMax, yMax, xLabel, yLabel, xTick)
	for i, s := range ss {
		var pts []string
		for j, y := range s.Y {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[j]), py(y)))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`, s.Color, dash, strings.Join(pts, " "))
		ly := padT + 14 + float64(i)*18
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="12" height="3" fill="%s"/><text x="%d" y="%.0f">%s</text>`,
			chartW-padR+12, ly-4, s.Color, chartW-padR+30, ly, html.EscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// axes draws the frame, five ticks per axis and the labels.
func axes(b *strings.Builder, xMax, yMax float64, xLabel, yLabel string, xTick func(float64) string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, padL, padT, plotW, plotH)
	for i := 0; i <= 5; i++ {
		x := padL + float64(i)/5*plotW
		y := padT + plotH - float64(i)/5*plotH
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" stroke="#eee"/>`, x, padT, x, padT+plotH)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, padL, y, padL+plotW, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, x, padT+plotH+15, xTick(xMax*float64(i)/5))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-5, y+4, tick(yMax*float64(i)/5))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-5, html.EscapeString(xLabel))
	fmt.Fprintf(b, `<text x="14" y="%.0f" text-anchor="middle" transform="rotate(-90 14 %.0f)">%s</text>`,
		padT+plotH/2, padT+plotH/2, html.EscapeString(yLabel))
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// niceCeil rounds v up to a round figure (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
// times a power of ten; 1 for v <= 0), so axes end near the data.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func stockChart(samples []StockSample) string {
	xs := make([]float64, len(samples))
	av, he, so, to := make([]float64, len(samples)), make([]float64, len(samples)), make([]float64, len(samples)), make([]float64, len(samples))
	for i, s := range samples {
		xs[i], av[i], he[i], so[i], to[i] = s.T, float64(s.Available), float64(s.Held), float64(s.Sold), float64(s.Total)
	}
	return lineChart(xs, []series{
		{Name: "available", Color: palette[2], Y: av},
		{Name: "held", Color: palette[1], Y: he},
		{Name: "sold", Color: palette[0], Y: so},
		{Name: "total", Color: "#999", Dashed: true, Y: to},
	}, "seconds since the drop opened", "units", nil)
}

// latencyBuckets are log-spaced upper bounds from 0.1 ms to 10 s, six per
// decade.
func latencyBuckets() []time.Duration {
	var out []time.Duration
	for i := 0; i <= 30; i++ {
		out = append(out, time.Duration(100_000*math.Pow(10, float64(i)/6)))
	}
	return out
}

// latencyCharts draws one histogram per operation, as lines over log-spaced
// buckets so the three operations share one chart.
func latencyCharts(samples []Sample) string {
	by := map[string][]time.Duration{}
	for _, s := range samples {
		by[s.Op] = append(by[s.Op], s.Latency)
	}
	return histogram(by, Ops, "requests")
}

// histogram draws the latencies of each named series over log-spaced
// buckets.
func histogram(by map[string][]time.Duration, names []string, yLabel string) string {
	bounds := latencyBuckets()
	counts := map[string][]float64{}
	last := 0
	for name, lat := range by {
		c := make([]float64, len(bounds))
		counts[name] = c
		for _, l := range lat {
			i := sort.Search(len(bounds), func(i int) bool { return l <= bounds[i] })
			i = min(i, len(bounds)-1)
			c[i]++
			last = max(last, i)
		}
	}
	n := min(len(bounds), last+2)
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = float64(i)
	}
	var ss []series
	for k, name := range names {
		if c := counts[name]; c != nil {
			ss = append(ss, series{Name: name, Color: palette[k%len(palette)], Y: c[:n]})
		}
	}
	// The x axis is the bucket index; its ticks name the bound there.
	at := func(x float64) string {
		return fmtLatency(time.Duration(100_000 * math.Pow(10, x/6)))
	}
	return lineChart(xs, ss, "latency (log scale, 6 buckets per decade)", yLabel, at)
}

// watchChart is the histogram of change-to-watcher latencies.
func watchChart(w *WatchResult) string {
	if w == nil {
		return ""
	}
	name := w.Transport + " watchers"
	return histogram(map[string][]time.Duration{name: w.Latencies}, []string{name}, "deliveries")
}

func fmtLatency(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3g ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3g s", d.Seconds())
}

// outcomeChart shows requests per second of the commonest operation:code
// pairs over time.
func outcomeChart(samples []Sample, elapsed float64) string {
	if len(samples) == 0 {
		return lineChart(nil, nil, "", "", nil)
	}
	width := math.Max(0.1, elapsed/60)
	nb := int(elapsed/width) + 1
	totals := map[string]int{}
	per := map[string][]float64{}
	for _, s := range samples {
		k := s.Op + ": " + s.Code
		totals[k]++
		if per[k] == nil {
			per[k] = make([]float64, nb)
		}
		per[k][min(nb-1, int(s.T/width))] += 1 / width
	}
	keys := sortedCodes(totals)
	if len(keys) > len(palette) {
		keys = keys[:len(palette)]
	}
	xs := make([]float64, nb)
	for i := range xs {
		xs[i] = float64(i) * width
	}
	var ss []series
	for i, k := range keys {
		ss = append(ss, series{Name: k, Color: palette[i], Y: per[k]})
	}
	return lineChart(xs, ss, "seconds since the drop opened", "requests per second", nil)
}
