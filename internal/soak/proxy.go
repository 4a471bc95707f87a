package soak

import (
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy between the workers and PostgreSQL that the soak
// controls: it can cut every connection, black-hole them (bytes are held,
// not forwarded, until the black hole ends) and slow them down.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	conns   map[net.Conn]net.Conn // client -> server
	hole    chan struct{}         // closed when the black hole ends; nil when none
	delay   time.Duration
	closed  bool
	wg      sync.WaitGroup
	Cuts    int // connections cut
	Accepts int
}

// NewProxy listens on 127.0.0.1 and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go func() { // exits when Close closes the listener
		defer p.wg.Done()
		p.accept()
	}()
	return p, nil
}

// Addr is the proxy's listen address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { // exits when either side closes
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

func (p *Proxy) serve(c net.Conn) {
	if !p.pass() {
		c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns[c] = s
	p.Accepts++
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(s, c) }()
	go func() { defer wg.Done(); p.pipe(c, s) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pass waits while the proxy is a black hole; it returns false when the
// proxy is closed.
func (p *Proxy) pass() bool {
	for {
		p.mu.Lock()
		hole, closed, delay := p.hole, p.closed, p.delay
		p.mu.Unlock()
		if closed {
			return false
		}
		if hole == nil {
			if delay > 0 {
				time.Sleep(delay)
			}
			return true
		}
		<-hole
	}
}

// pipe copies src to dst chunk by chunk, holding each chunk while the proxy
// is a black hole, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a cut: both sides close
		}
	}
}

// Cut closes every open connection (the database sees them reset).
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, s := range p.conns {
		c.Close()
		s.Close()
		n++
	}
	p.Cuts += n
	return n
}

// BlackHole holds every byte in both directions, and new connections, until
// the returned function is called.
func (p *Proxy) BlackHole() (end func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole != nil {
		return func() {}
	}
	ch := make(chan struct{})
	p.hole = ch
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.hole == ch {
			p.hole = nil
			close(ch)
		}
	}
}

// Slow delays every chunk by d (0 ends it).
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Close stops the proxy, cuts its connections and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
	p.mu.Unlock()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
