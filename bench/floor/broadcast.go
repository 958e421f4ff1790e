package floor

import (
	"encoding/json"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dropline/dropline/internal/websocket"
)

// Broadcaster is the fan-out floor: websocket clients speaking
// graphql-transport-ws subscribe to a SKU's stock (the query is not
// parsed, only the SKU is read from the variables), and each POST
// /change?sku=S&available=N frames one `next` message of the shape Dropline
// sends, once, and writes those same bytes to every socket of S, the sockets
// split between as many goroutines as the process has cores. A change that
// comes while S's previous fan-out is still writing waits for it, and only
// the latest such change is written (self-clocked coalescing): the machine
// is never asked to write more frames than it can. No GraphQL execution, no
// Redis, no per-subscriber state beyond the socket: what any server must
// spend to put one frame on each of N sockets.
//
// GET /metrics carries the Go and process collectors (process_cpu_seconds_total,
// process_resident_memory_bytes, go_goroutines), as Dropline's does.
type Broadcaster struct {
	mu      sync.Mutex
	conns   map[string][]net.Conn
	last    map[string][]byte // each SKU's last frame, sent to a new subscriber
	pending map[string][]byte // the frame waiting for the SKU's fan-out
	running map[string]bool   // the SKU's fan-out is writing
}

// NewBroadcaster returns an empty broadcaster.
func NewBroadcaster() *Broadcaster {
	return &Broadcaster{conns: map[string][]net.Conn{}, last: map[string][]byte{},
		pending: map[string][]byte{}, running: map[string]bool{}}
}

// Handler serves GET /graphql (websocket), POST /change and GET /metrics.
func (b *Broadcaster) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /graphql", b.subscribe)
	mux.HandleFunc("POST /change", b.change)
	mux.Handle("GET /metrics", promhttp.Handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

type noHooks struct{}

func (noHooks) MessageBegins() {}
func (noHooks) MessageEnds()   {}
func (noHooks) Ping([]byte)    {}

// frame is a graphql-transport-ws next message for subscription id 1.
func frame(sku string, available, total int) []byte {
	type stock struct {
		SKU       string `json:"sku"`
		Available int    `json:"available"`
		Held      int    `json:"held"`
		Sold      int    `json:"sold"`
		Total     int    `json:"total"`
	}
	msg := map[string]any{"id": "1", "type": "next", "payload": map[string]any{"data": map[string]any{
		"stockChanged": stock{SKU: sku, Available: available, Held: total - available, Total: total}}}}
	p, _ := json.Marshal(msg)
	return websocket.TextFrame(p)
}

func (b *Broadcaster) subscribe(w http.ResponseWriter, r *http.Request) {
	if err := websocket.CheckHandshake(w, r); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	conn, br, err := websocket.Upgrade(w, r, "graphql-transport-ws")
	if err != nil {
		return
	}
	rd := websocket.NewReader(br, 64<<10, noHooks{})
	if _, _, err := rd.ReadMessage(); err != nil { // connection_init
		_ = conn.Close()
		return
	}
	if _, err := conn.Write(websocket.TextFrame([]byte(`{"type":"connection_ack"}`))); err != nil {
		_ = conn.Close()
		return
	}
	_, msg, err := rd.ReadMessage() // subscribe
	if err != nil {
		_ = conn.Close()
		return
	}
	var sub struct {
		Payload struct {
			Variables struct {
				SKUs []string `json:"skus"`
			} `json:"variables"`
		} `json:"payload"`
	}
	if json.Unmarshal(msg, &sub) != nil || len(sub.Payload.Variables.SKUs) != 1 {
		_ = conn.Close()
		return
	}
	sku := sub.Payload.Variables.SKUs[0]
	b.mu.Lock()
	first, ok := b.last[sku]
	if !ok {
		first = frame(sku, 1_000_000, 1_000_000)
		b.last[sku] = first
	}
	_, err = conn.Write(first)
	if err == nil {
		b.conns[sku] = append(b.conns[sku], conn)
	}
	b.mu.Unlock()
	if err != nil {
		_ = conn.Close()
		return
	}
	// The client says nothing more until it closes.
	go func() {
		for {
			if _, _, err := rd.ReadMessage(); err != nil {
				b.remove(sku, conn)
				return
			}
		}
	}()
}

func (b *Broadcaster) remove(sku string, conn net.Conn) {
	b.mu.Lock()
	cs := b.conns[sku]
	for i, c := range cs {
		if c == conn {
			cs[i] = cs[len(cs)-1]
			b.conns[sku] = cs[:len(cs)-1]
			break
		}
	}
	b.mu.Unlock()
	_ = conn.Close()
}

// change hands SKU's new value to its fan-out and answers with the number
// of sockets the SKU has.
func (b *Broadcaster) change(w http.ResponseWriter, r *http.Request) {
	sku := r.URL.Query().Get("sku")
	available, err1 := strconv.Atoi(r.URL.Query().Get("available"))
	total, err2 := strconv.Atoi(r.URL.Query().Get("total"))
	if sku == "" || err1 != nil || err2 != nil {
		http.Error(w, "want sku, available and total", http.StatusBadRequest)
		return
	}
	f := frame(sku, available, total)
	b.mu.Lock()
	b.last[sku] = f
	b.pending[sku] = f
	n := len(b.conns[sku])
	if !b.running[sku] {
		b.running[sku] = true
		go b.fanOut(sku)
	}
	b.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(strconv.Itoa(n) + "\n"))
}

// fanOut writes SKU's pending frame to all its sockets, then the one that
// came meanwhile, until none is pending.
func (b *Broadcaster) fanOut(sku string) {
	for {
		b.mu.Lock()
		f := b.pending[sku]
		delete(b.pending, sku)
		if f == nil {
			b.running[sku] = false
			b.mu.Unlock()
			return
		}
		conns := append([]net.Conn(nil), b.conns[sku]...)
		b.mu.Unlock()
		parts := min(runtime.GOMAXPROCS(0), max(len(conns), 1))
		var wg sync.WaitGroup
		for p := range parts {
			wg.Go(func() {
				for i := p; i < len(conns); i += parts {
					_, _ = conns[i].Write(f)
				}
			})
		}
		wg.Wait()
	}
}
