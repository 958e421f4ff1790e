package httpbench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// metricsSample is what the peak reads from /metrics.
type metricsSample struct {
	at           time.Time
	lag          float64 // dropline_writebehind_lag_seconds
	backlog      float64 // dropline_writebehind_backlog
	applied      float64 // dropline_writebehind_events_applied_total
	batchSeconds float64 // dropline_writebehind_batch_duration_seconds_sum
	batches      float64 // dropline_writebehind_batch_duration_seconds_count
	checkSeconds float64 // dropline_writebehind_flush_check_duration_seconds_sum
}

func scrape(ctx context.Context, client *http.Client, base string) (metricsSample, error) {
	s := metricsSample{at: time.Now()}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := client.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("/metrics: %s", resp.Status)
	}
	want := map[string]*float64{
		"dropline_writebehind_lag_seconds":                      &s.lag,
		"dropline_writebehind_backlog":                          &s.backlog,
		"dropline_writebehind_events_applied_total":             &s.applied,
		"dropline_writebehind_batch_duration_seconds_sum":       &s.batchSeconds,
		"dropline_writebehind_batch_duration_seconds_count":     &s.batches,
		"dropline_writebehind_flush_check_duration_seconds_sum": &s.checkSeconds,
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if p, ok := want[name]; ok {
			*p, _ = strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	return s, sc.Err()
}
