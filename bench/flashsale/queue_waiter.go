package flashsale

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// queueWaiter is one websocket subscription of queueChanged: the newest
// state it received, and when SOLD_OUT first came.
type queueWaiter struct {
	c       *watchConn
	mu      sync.Mutex
	status  string
	through int64
	told    time.Time
	err     error
	changed chan struct{} // a value of capacity 1: something arrived
	first   chan struct{} // closed on the first value
}

func (w *queueWaiter) run() {
	firstDone := false
	defer func() {
		if !firstDone {
			close(w.first)
		}
	}()
	for {
		msg, err := w.c.nextMessage()
		now := time.Now()
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			w.poke()
			return
		}
		var m struct {
			Payload struct {
				Data struct {
					QueueChanged struct {
						Status          string `json:"status"`
						AdmittedThrough int64  `json:"admittedThrough"`
					} `json:"queueChanged"`
				} `json:"data"`
				Errors []json.RawMessage `json:"errors"`
			} `json:"payload"`
		}
		err = json.Unmarshal(msg, &m)
		if err == nil && len(m.Payload.Errors) > 0 {
			err = fmt.Errorf("subscription error: %.200s", m.Payload.Errors[0])
		}
		w.mu.Lock()
		if err != nil {
			w.err = err
		} else {
			q := m.Payload.Data.QueueChanged
			w.status = q.Status
			w.through = max(w.through, q.AdmittedThrough)
			if q.Status == "SOLD_OUT" && w.told.IsZero() {
				w.told = now
			}
		}
		w.mu.Unlock()
		if !firstDone {
			firstDone = true
			close(w.first)
		}
		w.poke()
	}
}

func (w *queueWaiter) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *queueWaiter) state() (status string, through int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status, w.through, w.err
}
