package histories

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a PostgreSQL fault proxy: a TCP listener on 127.0.0.1 that forwards every connection it accepts to one
// PostgreSQL server, reading the wire protocol's framing (after the startup packet, every message is a type byte
// and a length), and injects network faults on command:
//
//   - DropCommitReply: the server's reply to the next exchange that commits (an explicit COMMIT, or a write that
//     commits by itself at its Sync) is withheld and the connection cut: the client sees a lost connection after
//     the server committed.
//   - DropCommitRequest: the next message that would make the server commit (a COMMIT, or the Sync ending a write
//     in an implicit transaction) is withheld and the connection cut: the client sees a lost connection and the
//     server never commits.
//   - BlackHole: stop forwarding in one or both directions without closing anything, until Heal.
//   - SetDelay: delay every forwarded message by a fixed time plus a random jitter.
//   - CutAll: close every connection at once; CutMidStream: cut the next server reply halfway through a message.
//   - HalfOpen: close the server-to-client direction of every connection (the client reads end of stream) while
//     the client-to-server direction keeps forwarding until the client closes.
//
// A client's SSL (and GSS encryption) request is refused with 'N', so clients talk plaintext through the proxy.
// The zero Proxy is not usable: construct one with NewProxy. Close it when done.
type Proxy struct {
	target string
	ln     net.Listener
	logger *slog.Logger
	raw    bool

	mu         sync.Mutex
	links      map[*link]struct{}
	closed     bool
	rng        *rand.Rand
	delay      time.Duration
	jitter     time.Duration
	blackhole  Direction
	healed     chan struct{}  // closed (and replaced) on every change of the black hole
	dropReply  int            // commit replies left to drop
	dropTo     map[string]int // commit replies left to drop on connections whose application_name has the prefix
	dropReq    int            // commit requests left to drop
	cutMid     int            // server replies left to cut halfway
	stats      ProxyStats
	byApp      map[string]*AppFaults
	wg         sync.WaitGroup
	acceptDone chan struct{}
}

// Direction is a direction of a proxied connection, or both (a bit set).
type Direction int

const (
	// ClientToServer is what the client sends.
	ClientToServer Direction = 1 << iota
	// ServerToClient is what the server replies.
	ServerToClient
	// Both directions.
	Both = ClientToServer | ServerToClient
)

func (d Direction) String() string {
	switch d {
	case 0:
		return "none"
	case ClientToServer:
		return "client->server"
	case ServerToClient:
		return "server->client"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// ProxyStats counts what a proxy did.
type ProxyStats struct {
	Accepted        int // client connections accepted
	SSLRefused      int // SSL or GSS encryption requests answered 'N'
	CommitReplies   int // commit replies withheld (DropCommitReply)
	CommitRequests  int // commit requests withheld (DropCommitRequest)
	Cut             int // connections closed by CutAll, a dropped commit or CutMidStream
	CutMidStream    int // server messages cut halfway
	HalfOpened      int // connections whose server-to-client direction was closed by HalfOpen
	MessagesDelayed int // messages held back by SetDelay
}

// AppFaults counts the faults that hit the connections of one application_name.
type AppFaults struct {
	CommitReplies  int // commit replies withheld
	CommitRequests int // commit requests withheld
}

// ProxyOptions configure NewProxy.
type ProxyOptions struct {
	// Seed seeds the jitter of SetDelay. Default 0 (a fixed sequence).
	Seed uint64
	// Logger receives one line per fault injected. Default: silent.
	Logger *slog.Logger
	// Raw forwards bytes as they come, without reading PostgreSQL's protocol: a proxy for another server (a
	// broker). The black holes, delay, cuts and half-opens apply (CutMidStream cuts the next chunk the server
	// sends halfway); the commit drops never fire. Default false.
	Raw bool
}

// NewProxy listens on a free port of 127.0.0.1 and forwards every connection to target ("host:port").
func NewProxy(target string, opts ProxyOptions) (*Proxy, error) {
	if target == "" {
		return nil, errors.New("histories: proxy target must not be empty")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("histories: proxy listen: %w", err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		target:     target,
		ln:         ln,
		logger:     logger,
		raw:        opts.Raw,
		links:      map[*link]struct{}{},
		byApp:      map[string]*AppFaults{},
		dropTo:     map[string]int{},
		rng:        rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		healed:     make(chan struct{}),
		acceptDone: make(chan struct{}),
	}
	go p.accept()
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// FaultsOn returns the commit drops that hit connections whose startup named application_name app, so far.
func (p *Proxy) FaultsOn(app string) AppFaults {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.byApp[app]; f != nil {
		return *f
	}
	return AppFaults{}
}

// Stats returns what the proxy did so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops accepting, closes every connection and waits for the proxy's goroutines. Safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	links := p.linkList()
	p.mu.Unlock()
	if already {
		return nil
	}
	err := p.ln.Close()
	<-p.acceptDone
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

// SetDelay delays every message forwarded from now on by d plus a uniformly random jitter in [0, jitter).
// SetDelay(0, 0) removes the delay.
func (p *Proxy) SetDelay(d, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.jitter = d, jitter
	p.logger.Info("histories: proxy delay", "delay", d, "jitter", jitter)
}

// BlackHole stops forwarding in the directions dir (replacing any earlier black hole) on every connection, new ones
// included, without closing anything: what is read waits until Heal. BlackHole(0) is Heal.
func (p *Proxy) BlackHole(dir Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = dir
	close(p.healed)
	p.healed = make(chan struct{})
	p.logger.Info("histories: proxy black hole", "direction", dir)
}

// Heal removes the black hole and the delay.
func (p *Proxy) Heal() {
	p.BlackHole(0)
	p.SetDelay(0, 0)
}

// DropCommitReply arms the proxy to withhold the server's reply to the next exchange that commits, on any
// connection, and to cut that connection (the server has committed; the client sees a lost connection).
func (p *Proxy) DropCommitReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropReply++
}

// DropCommitReplyTo is DropCommitReply on the next connection whose startup named an application_name that
// begins with prefix: the exchange that commits next on one of those connections loses its reply.
func (p *Proxy) DropCommitReplyTo(prefix string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropTo[prefix]++
}

// DropCommitRequest arms the proxy to withhold the next message that would make the server commit, on any
// connection, and to cut that connection (the server rolls the transaction back).
func (p *Proxy) DropCommitRequest() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropReq++
}

// Disarm cancels the commit drops and mid-stream cuts armed and not yet used.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropReply, p.dropReq, p.cutMid = 0, 0, 0
	clear(p.dropTo)
}

// CutMidStream arms the proxy to forward only the first half of the next server message of at least two bytes, on
// any connection, and then to cut that connection.
func (p *Proxy) CutMidStream() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutMid++
}

// CutAll closes every connection now, both ways, and returns how many it closed.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	links := p.linkList()
	p.stats.Cut += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	p.logger.Info("histories: proxy cut every connection", "connections", len(links))
	return len(links)
}

// HalfOpen closes the server-to-client direction of every open connection: the client reads end of stream while
// what it sends is still forwarded to the server (until the client closes, which the server then sees). It returns
// how many connections it half-closed.
func (p *Proxy) HalfOpen() int {
	p.mu.Lock()
	links := p.linkList()
	p.stats.HalfOpened += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.halfClose()
	}
	p.logger.Info("histories: proxy half-opened every connection", "connections", len(links))
	return len(links)
}

// Connections is how many proxied connections are open.
func (p *Proxy) Connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// ConnectionsOf is how many proxied connections whose startup named application_name app are open. A test that
// counts its own connections this way is not misled by a stray dial to a recycled port.
func (p *Proxy) ConnectionsOf(app string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.app == app {
			n++
		}
	}
	return n
}

// ConnectionsFrom is how many proxied connections are open from the client address addr (a client's
// LocalAddr): for a raw proxy, whose connections carry no application name, a test counts its own this way.
func (p *Proxy) ConnectionsFrom(addr net.Addr) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.client.RemoteAddr().String() == addr.String() {
			n++
		}
	}
	return n
}

func (p *Proxy) linkList() []*link {
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

func (p *Proxy) accept() {
	defer close(p.acceptDone)
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.stats.Accepted++
		l := &link{p: p, client: c.(*net.TCPConn), done: make(chan struct{})}
		l.status.Store('I')
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// take consumes one armed fault counter under the lock for l: it reports whether it was armed. appStat picks the
// per-application counter to increment, if any.
func (p *Proxy) take(l *link, counter *int, stat *int, appStat func(*AppFaults) *int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if *counter == 0 {
		return false
	}
	*counter--
	*stat++
	p.stats.Cut++
	if appStat != nil {
		f := p.byApp[l.app]
		if f == nil {
			f = &AppFaults{}
			p.byApp[l.app] = f
		}
		*appStat(f)++
	}
	return true
}

// hold waits for the black hole on dir to lift and for the delay, and reports false when the link closed first.
func (p *Proxy) hold(l *link, dir Direction) bool {
	for {
		p.mu.Lock()
		blocked := p.blackhole&dir != 0
		healed := p.healed
		wait := p.delay
		if p.jitter > 0 {
			wait += time.Duration(p.rng.Int64N(int64(p.jitter)))
		}
		if !blocked && wait > 0 {
			p.stats.MessagesDelayed++
		}
		p.mu.Unlock()
		if blocked {
			select {
			case <-healed:
				continue
			case <-l.done:
				return false
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return false
			}
		}
		return true
	}
}

// link is one proxied connection.
type link struct {
	p              *Proxy
	client, server *net.TCPConn
	done           chan struct{}
	closeOnce      sync.Once
	halfOnce       sync.Once
	app            string       // the application_name of the startup packet (set before the pumps start)
	status         atomic.Int32 // the transaction status of the server's last ReadyForQuery: 'I', 'T' or 'E'
	// stmts maps the prepared statements the client parsed to the kind of their SQL (client-to-server pump only).
	stmts map[string]stmtKind
}

func (l *link) close() {
	l.closeOnce.Do(func() {
		close(l.done)
		_ = l.client.SetLinger(0) // a reset, as a broken network shows it
		_ = l.client.Close()
		l.p.mu.Lock()
		server := l.server
		l.p.mu.Unlock()
		if server != nil {
			_ = server.Close()
		}
	})
}

func (l *link) halfClose() {
	l.halfOnce.Do(func() { _ = l.client.CloseWrite() })
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer func() {
		l.close()
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	}()
	var startup []byte
	if !l.p.raw {
		var err error
		if startup, err = l.readStartup(); err != nil {
			return
		}
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	sc, err := d.Dial("tcp", l.p.target)
	if err != nil {
		l.p.logger.Warn("histories: proxy could not reach the server", "error", err)
		return
	}
	l.p.mu.Lock()
	l.server = sc.(*net.TCPConn)
	closed := l.p.closed
	l.p.mu.Unlock()
	select {
	case <-l.done: // cut before the server connection existed
		_ = sc.Close()
		return
	default:
	}
	if closed {
		return
	}
	if l.p.raw {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); l.rawPump(l.client, l.server, ClientToServer) }()
		go func() { defer wg.Done(); l.rawPump(l.server, l.client, ServerToClient) }()
		wg.Wait()
		return
	}
	if _, err := l.server.Write(startup); err != nil {
		return
	}
	l.p.mu.Lock()
	l.app = startupParam(startup, "application_name")
	l.p.mu.Unlock()
	if isCancelRequest(startup) {
		_, _ = io.Copy(io.Discard, l.server) // the server closes after a cancel request
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.clientToServer() }()
	go func() { defer wg.Done(); l.serverToClient() }()
	wg.Wait()
}

const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	cancelRequestCode = 80877102
	maxMessage        = 1 << 30
)

// readStartup reads the client's first packet, answering SSL and GSS encryption requests with 'N' until the real
// startup (or cancel) packet arrives, and returns it.
func (l *link) readStartup() ([]byte, error) {
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(l.client, hdr[:]); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 8 || n > 10000 {
			return nil, fmt.Errorf("histories: startup packet of %d bytes", n)
		}
		pkt := make([]byte, n)
		copy(pkt, hdr[:])
		if _, err := io.ReadFull(l.client, pkt[4:]); err != nil {
			return nil, err
		}
		code := binary.BigEndian.Uint32(pkt[4:8])
		if n == 8 && (code == sslRequestCode || code == gssEncRequestCode) {
			l.p.mu.Lock()
			l.p.stats.SSLRefused++
			l.p.mu.Unlock()
			if _, err := l.client.Write([]byte{'N'}); err != nil {
				return nil, err
			}
			continue
		}
		return pkt, nil
	}
}

// startupParam returns the value of parameter name in a startup packet ("" when absent).
func startupParam(pkt []byte, name string) string {
	if len(pkt) < 8 {
		return ""
	}
	rest := pkt[8:]
	for len(rest) > 0 {
		var k, v string
		k, rest = cstring(rest)
		if k == "" {
			return ""
		}
		v, rest = cstring(rest)
		if k == name {
			return v
		}
	}
	return ""
}

func isCancelRequest(pkt []byte) bool {
	return len(pkt) == 16 && binary.BigEndian.Uint32(pkt[4:8]) == cancelRequestCode
}

// readMessage reads one typed message (type byte, length, body) whole.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > maxMessage {
		return nil, fmt.Errorf("histories: message %q of length %d", hdr[0], n)
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// stmtKind classifies SQL for the commit rules.
type stmtKind int

const (
	stmtOther  stmtKind = iota
	stmtWrite           // INSERT, UPDATE, DELETE (and CTEs holding one)
	stmtCommit          // COMMIT or END
)

func classify(sql string) stmtKind {
	s := strings.ToUpper(strings.TrimSpace(sql))
	s = strings.TrimSuffix(s, ";")
	if s == "COMMIT" || s == "END" || strings.HasPrefix(s, "COMMIT ") || strings.HasPrefix(s, "END ") {
		return stmtCommit
	}
	for _, w := range []string{"INSERT", "UPDATE", "DELETE"} {
		if strings.Contains(s, w) {
			return stmtWrite
		}
	}
	return stmtOther
}

// cstrings splits a message body into its NUL-terminated strings.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// clientToServer forwards the client's messages. It tracks, per exchange (up to a Sync or a simple query), whether
// the exchange commits, to apply DropCommitRequest.
func (l *link) clientToServer() {
	defer func() { _ = l.server.CloseWrite() }()
	l.stmts = map[string]stmtKind{}
	var cycle stmtKind // the strongest kind bound since the last Sync
	for {
		msg, err := readMessage(l.client)
		if err != nil {
			return
		}
		commits := false
		switch msg[0] {
		case 'Q':
			sql, _ := cstring(msg[5:])
			k := classify(sql)
			commits = k == stmtCommit || (k == stmtWrite && l.status.Load() == 'I')
		case 'P':
			name, rest := cstring(msg[5:])
			sql, _ := cstring(rest)
			l.stmts[name] = classify(sql)
		case 'B':
			_, rest := cstring(msg[5:])
			name, _ := cstring(rest)
			if k := l.stmts[name]; k > cycle {
				cycle = k
			}
		case 'S':
			commits = cycle == stmtCommit || (cycle == stmtWrite && l.status.Load() == 'I')
			cycle = stmtOther
		}
		if commits && l.p.take(l, &l.p.dropReq, &l.p.stats.CommitRequests,
			func(f *AppFaults) *int { return &f.CommitRequests }) {
			l.p.logger.Info("histories: proxy dropped a commit request and cut the connection")
			l.close()
			return
		}
		if !l.p.hold(l, ClientToServer) {
			return
		}
		if _, err := l.server.Write(msg); err != nil {
			return
		}
	}
}

// serverToClient forwards the server's messages. While a commit reply is to be dropped, it holds each exchange's
// reply back until its ReadyForQuery, and withholds it (cutting the connection) when the exchange committed.
func (l *link) serverToClient() {
	defer l.halfClose()
	var (
		pending   [][]byte
		buffering bool
		sawCommit bool // a CommandComplete "COMMIT" in the pending reply
		sawWrite  bool // a CommandComplete of INSERT, UPDATE or DELETE in the pending reply
		sawError  bool // an ErrorResponse in the pending reply: an implicit transaction rolled back
	)
	began := byte('I') // the transaction status when the pending reply's exchange began
	for {
		msg, err := readMessage(l.server)
		if err != nil {
			return
		}
		// A notification (or notice, or parameter status) between exchanges is not a reply: an idle listening
		// connection receives nothing else, so buffering from it would hold its notifications until a
		// ReadyForQuery that never comes.
		async := msg[0] == 'A' || msg[0] == 'N' || msg[0] == 'S'
		if !buffering && l.armed() && !async {
			buffering, sawCommit, sawWrite, sawError = true, false, false, false
			began = byte(l.status.Load())
		}
		if len(msg) >= 7 && l.p.take(l, &l.p.cutMid, &l.p.stats.CutMidStream, nil) {
			l.p.logger.Info("histories: proxy cut a server message halfway")
			if l.flush(pending) && l.p.hold(l, ServerToClient) {
				_, _ = l.client.Write(msg[:len(msg)/2])
			}
			l.close()
			return
		}
		switch msg[0] {
		case 'C':
			tag, _ := cstring(msg[5:])
			switch {
			case tag == "COMMIT":
				sawCommit = true
			case strings.HasPrefix(tag, "INSERT"), strings.HasPrefix(tag, "UPDATE"), strings.HasPrefix(tag, "DELETE"):
				sawWrite = true
			}
		case 'E':
			sawError = true
		case 'Z':
			if len(msg) >= 6 {
				l.status.Store(int32(msg[5]))
			}
		}
		if !buffering {
			if !l.p.hold(l, ServerToClient) {
				return
			}
			if _, err := l.client.Write(msg); err != nil {
				return
			}
			continue
		}
		pending = append(pending, msg)
		if msg[0] != 'Z' {
			continue
		}
		committed := len(msg) >= 6 && msg[5] == 'I' && (sawCommit || (sawWrite && !sawError && began == 'I'))
		if committed && l.takeReply() {
			l.p.logger.Info("histories: proxy dropped a commit reply and cut the connection")
			l.close()
			return
		}
		if !l.flush(pending) {
			return
		}
		pending, buffering = nil, false
	}
}

func (l *link) armed() bool {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	return l.p.dropReply > 0 || l.targetedLocked() != ""
}

// targetedLocked returns the prefix of a DropCommitReplyTo armed for l's application_name, or "".
func (l *link) targetedLocked() string {
	for prefix, n := range l.p.dropTo {
		if n > 0 && strings.HasPrefix(l.app, prefix) {
			return prefix
		}
	}
	return ""
}

// takeReply consumes a commit reply drop armed for l (any connection's first, then l's application_name's).
func (l *link) takeReply() bool {
	if l.p.take(l, &l.p.dropReply, &l.p.stats.CommitReplies, func(f *AppFaults) *int { return &f.CommitReplies }) {
		return true
	}
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	prefix := l.targetedLocked()
	if prefix == "" {
		return false
	}
	p.dropTo[prefix]--
	p.stats.CommitReplies++
	p.stats.Cut++
	f := p.byApp[l.app]
	if f == nil {
		f = &AppFaults{}
		p.byApp[l.app] = f
	}
	f.CommitReplies++
	return true
}

// flush forwards held-back server messages to the client.
func (l *link) flush(msgs [][]byte) bool {
	for _, m := range msgs {
		if !l.p.hold(l, ServerToClient) {
			return false
		}
		if _, err := l.client.Write(m); err != nil {
			return false
		}
	}
	return true
}

// rawPump forwards bytes from one side to the other as they come (Raw), holding each chunk for the black hole and
// the delay, and cutting the next chunk from the server halfway when CutMidStream is armed.
func (l *link) rawPump(from, to *net.TCPConn, dir Direction) {
	defer func() {
		if dir == ServerToClient {
			l.halfClose()
		} else {
			_ = to.CloseWrite()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if !l.p.hold(l, dir) {
				return
			}
			if dir == ServerToClient && n >= 2 && l.p.take(l, &l.p.cutMid, &l.p.stats.CutMidStream, nil) {
				l.p.logger.Info("histories: proxy cut a server chunk halfway")
				_, _ = to.Write(buf[:n/2])
				l.close()
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
