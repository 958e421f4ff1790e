package testenv

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a loopback TCP proxy a test puts between the code under test and
// Redis or Postgres, to cut and restore the connection (an outage), or to
// make it lose replies: the request reaches the server, its answer never
// reaches the client, and the connection is closed, so the client's driver
// retries a command the server has already run.
type Proxy struct {
	Addr     string
	upstream string
	ln       net.Listener

	cut atomic.Bool
	// dropPerMille is the chance, in thousandths, that a chunk of a reply
	// is swallowed and its connection closed.
	dropPerMille atomic.Int64
	// Dropped counts replies swallowed; Cuts counts connections refused or
	// closed by a cut.
	Dropped atomic.Int64
	Cuts    atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port (Addr) and forwards every
// connection to upstream until the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			p.Cuts.Add(1)
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(c, up)
		p.wg.Add(2)
		go p.pipe(up, c, false) // client -> server: always delivered
		go p.pipe(c, up, true)  // server -> client: may be lost
	}
}

func (p *Proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *Proxy) pipe(dst, src net.Conn, replies bool) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.cut.Load() {
				return
			}
			if replies {
				if pm := p.dropPerMille.Load(); pm > 0 && rand.Int64N(1000) < pm { //nolint:gosec // a fault chance, not a secret
					p.Dropped.Add(1)
					return // the answer is lost, and so is the connection
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a cut connection: either way this direction is done
		}
	}
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.cut.Store(true)
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
		p.Cuts.Add(1)
	}
	p.mu.Unlock()
}

// Restore lets connections through again.
func (p *Proxy) Restore() { p.cut.Store(false) }

// LoseReplies sets the chance (per mille) of losing a reply chunk.
func (p *Proxy) LoseReplies(perMille int64) { p.dropPerMille.Store(perMille) }

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
