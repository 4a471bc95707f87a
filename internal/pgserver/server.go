// Package pgserver runs throwaway PostgreSQL servers, for the test harness
// (internal/pgtest) and for the dev stack behind `make run`. It does not
// import package testing, so a binary may link it.
//
// [Start] creates a data directory, runs initdb and starts postgres through
// pg_ctl on a free 127.0.0.1 port, tuned for speed rather than durability
// (fsync and full_page_writes off).
//
// The server binaries (pg_ctl, initdb, postgres) come from the PATH or from
// the newest /usr/lib/postgresql/<version>/bin (Debian package postgresql).
// initdb and postgres refuse to run as root, so when the process runs as
// root the server runs as the OS user postgres, which must be able to reach
// the data directory.
//
// A server started by pg_ctl is a daemon: it outlives a process that
// crashes or times out. [Start] therefore stops and removes the servers of
// its default temporary directories (os.TempDir()/pgtest-*; the name
// predates this package and is kept so that older leftovers are reaped
// too) whose owning process is gone.
//
// The package is Unix-only.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotInstalled is returned (wrapped) by [Start] when the PostgreSQL
// server binaries cannot be found.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (pg_ctl, initdb, postgres) not found")

// Options configures [Start]. The zero value is ready to use.
type Options struct {
	// Dir is the data directory (PGDATA). Default "": a new directory
	// os.TempDir()/pgtest-*/data, removed with its parent by Close.
	// When Dir is set and already holds a cluster (a PG_VERSION file), initdb
	// is skipped and the cluster is reused, so data survives between runs;
	// when Dir does not exist it is created, and Close removes it; an
	// existing Dir is never removed. Trap: when running as root the server
	// runs as the OS user postgres, which must be able to search every parent
	// of Dir (a Dir under t.TempDir() does not qualify).
	Dir string
	// Port is the TCP port to listen on, on 127.0.0.1 only. Default 0: a
	// free port is picked, and another one if the first is taken before
	// postgres binds it. Restart reuses the port either way.
	Port int
	// BinDir is the directory holding pg_ctl, initdb and postgres. Default
	// "": the directory of pg_ctl on the PATH (symlinks resolved), else the
	// newest /usr/lib/postgresql/<version>/bin.
	BinDir string
	// StartTimeout bounds initdb plus the first start until the server
	// accepts connections, and each Restart. Default 60 s. The context
	// passed to Start and Restart can cut it shorter.
	StartTimeout time.Duration
	// Logf receives progress lines (initdb, start, stop). Default: discard.
	// Pass t.Logf only for a server that is closed before the test ends.
	Logf func(format string, args ...any)
}

const (
	defaultStartTimeout = 60 * time.Second
	stopTimeout         = 60 * time.Second
	ownerFile           = "pgtest-owner.pid" // in the temporary parent: the PID of the owning process
	confFile            = "pgtest.conf"      // in the data directory, rewritten at every start
	logFile             = "pgtest.log"       // in the data directory, appended to by postgres
	tempPattern         = "pgtest-*"
	maxSocketPath       = 107 // sizeof(sockaddr_un.sun_path) - 1 on Linux
)

// Server is a PostgreSQL server started by [Start]. Its methods are safe
// for concurrent use.
type Server struct {
	binDir  string
	dataDir string
	// removeDir is the directory Close removes: the temporary parent of
	// dataDir, or dataDir when Start created it; "" for none.
	removeDir    string
	port         int
	cred         *syscall.Credential // non-nil: run server commands as this user (when root)
	startTimeout time.Duration
	logf         func(format string, args ...any)

	mu      sync.Mutex
	running bool
	closed  bool
}

// Start creates (or reuses, see [Options.Dir]) a data directory, runs
// initdb -A trust -U postgres --no-sync -E UTF8 --locale=C when needed,
// starts postgres with pg_ctl listening on 127.0.0.1:[Options.Port] (unix
// socket inside the data directory; fsync=off, full_page_writes=off,
// max_connections=200) and returns once a pgx connection pings, within
// [Options.StartTimeout].
//
// It returns an error wrapping [ErrNotInstalled] when the binaries are
// missing, and an error that includes the tail of the server log when
// initdb or the start fails; on error nothing is left running and a
// directory Start created is removed. The caller owns the server and must
// Close it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s := &Server{
		port:         opts.Port,
		startTimeout: opts.StartTimeout,
		logf:         opts.Logf,
	}
	if s.startTimeout <= 0 {
		s.startTimeout = defaultStartTimeout
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	var err error
	if s.binDir, err = findBinDir(opts.BinDir); err != nil {
		return nil, err
	}
	if s.cred, err = serverCredential(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.startTimeout)
	defer cancel()

	if opts.Dir == "" {
		reapOrphans(ctx, s.binDir, s.cred, s.logf)
	}
	if err := s.prepareDir(opts.Dir); err != nil {
		s.removeDirs()
		return nil, err
	}
	if err := s.initdb(ctx); err != nil {
		s.removeDirs()
		return nil, err
	}
	tries := 1
	if opts.Port == 0 {
		tries = 3 // a picked port can be taken by another process before postgres binds it
	}
	for try := 1; ; try++ {
		if opts.Port == 0 {
			if s.port, err = freePort(); err != nil {
				s.removeDirs()
				return nil, err
			}
		}
		err = s.start(ctx)
		if err == nil || try == tries || ctx.Err() != nil {
			break
		}
		s.logf("pgserver: start on port %d failed, trying another port: %v", s.port, err)
	}
	if err != nil {
		s.removeDirs()
		return nil, err
	}
	return s, nil
}

// URL returns the connection string of the server's postgres database as
// the superuser postgres (trust authentication, no password):
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable. It stays
// the same across Stop and Restart.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// DataDir returns the absolute path of the data directory (PGDATA). The
// server log is the file pgtest.log in it.
func (s *Server) DataDir() string { return s.dataDir }

// Stop shuts the server down (pg_ctl stop -m fast: open connections are
// terminated, then it exits) and waits for it, keeping the data directory,
// so that [Server.Restart] brings it back with its data. Tests use it to
// simulate a database outage: connecting then fails with "connection
// refused". Stopping a stopped server does nothing; ctx bounds the wait
// (default cap 60 s).
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pgserver: stop: server is closed")
	}
	return s.stop(ctx, "fast")
}

// Restart starts the server again on the same port with the same data,
// stopping it first when it is running, and returns once it accepts
// connections (within [Options.StartTimeout]). It fails when the port has
// been taken in the meantime, or after Close.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pgserver: restart: server is closed")
	}
	if err := s.stop(ctx, "fast"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.startTimeout)
	defer cancel()
	return s.start(ctx)
}

// Close stops the server (fast, falling back to immediate) and removes
// the data directory unless it existed before Start (see [Options.Dir]).
// It is idempotent; later calls return nil.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := s.stop(ctx, "fast")
	if err != nil {
		if err2 := s.stop(ctx, "immediate"); err2 == nil {
			err = nil
		}
	}
	if err != nil && s.removeDir != "" {
		// Removing the directory of a running postmaster makes it shut
		// itself down within a minute (its lock file is checked).
		err = fmt.Errorf("%w (data directory removed anyway)", err)
	}
	return errors.Join(err, s.removeDirs())
}

// prepareDir sets dataDir (absolute) and removeDir, creating what is
// missing and handing it to the server user.
func (s *Server) prepareDir(dir string) error {
	if dir == "" {
		base, err := os.MkdirTemp("", tempPattern)
		if err != nil {
			return fmt.Errorf("pgserver: create temporary directory: %w", err)
		}
		s.removeDir = base
		if err := os.WriteFile(filepath.Join(base, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		s.dataDir = filepath.Join(base, "data")
		if err := os.Mkdir(s.dataDir, 0o700); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		return s.chown(base, s.dataDir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("pgserver: data directory %s: %w", dir, err)
	}
	s.dataDir = abs
	switch _, err := os.Stat(abs); {
	case errors.Is(err, os.ErrNotExist):
		// Parents get 0755 so that the server user can reach abs.
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return fmt.Errorf("pgserver: create data directory: %w", err)
		}
		s.removeDir = abs
	case err != nil:
		return fmt.Errorf("pgserver: data directory: %w", err)
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return fmt.Errorf("pgserver: data directory: %w", err)
	}
	if !fileExists(filepath.Join(abs, "PG_VERSION")) {
		return s.chown(abs)
	}
	return nil
}

// initdb creates the cluster unless the data directory holds one, and
// hooks pgtest.conf into postgresql.conf.
func (s *Server) initdb(ctx context.Context) error {
	conf := filepath.Join(s.dataDir, "postgresql.conf")
	if !fileExists(filepath.Join(s.dataDir, "PG_VERSION")) {
		s.logf("pgserver: initdb %s", s.dataDir)
		if _, err := s.run(ctx, "initdb", "-D", s.dataDir, "-A", "trust", "-U", "postgres",
			"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	include := "include_if_exists = '" + confFile + "'"
	if !bytes.Contains(b, []byte(include)) {
		f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		_, err = fmt.Fprintf(f, "\n# Added by internal/pgserver.\n%s\n", include)
		if err := errors.Join(err, f.Close()); err != nil {
			return fmt.Errorf("pgserver: append to %s: %w", conf, err)
		}
	}
	return nil
}

// start writes pgtest.conf for s.port, runs pg_ctl start and waits until
// the server accepts connections. On failure it makes sure nothing runs.
// Callers hold s.mu or own s exclusively.
func (s *Server) start(ctx context.Context) error {
	if err := s.writeConf(); err != nil {
		return err
	}
	log := filepath.Join(s.dataDir, logFile)
	s.logf("pgserver: starting postgres on 127.0.0.1:%d (data %s)", s.port, s.dataDir)
	began := time.Now()
	wait := max(1, int(time.Until(deadline(ctx, s.startTimeout)).Seconds()))
	if _, err := s.run(ctx, "pg_ctl", "start", "-D", s.dataDir, "-l", log, "-w", "-s",
		"-t", strconv.Itoa(wait)); err != nil {
		s.stopQuietly()
		return fmt.Errorf("%w\n%s", err, s.logTail())
	}
	s.running = true
	if err := waitReady(ctx, s.URL()); err != nil {
		s.stopQuietly()
		return fmt.Errorf("%w\n%s", err, s.logTail())
	}
	s.logf("pgserver: postgres ready on 127.0.0.1:%d after %s", s.port, time.Since(began).Round(time.Millisecond))
	return nil
}

// writeConf writes the settings this package owns; postgresql.conf includes the
// file, so it overrides what initdb wrote.
func (s *Server) writeConf() error {
	sockets := s.dataDir
	if len(sockets)+len("/.s.PGSQL.65535") > maxSocketPath {
		sockets = "" // path too long for a unix socket: TCP only
	}
	conf := fmt.Sprintf(`# Written by internal/pgserver at every start; edits are lost.
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = %s
fsync = off
full_page_writes = off
max_connections = 200
`, s.port, confString(sockets))
	path := filepath.Join(s.dataDir, confFile)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return s.chown(path)
}

// stop runs pg_ctl stop with the given mode when the server is running.
func (s *Server) stop(ctx context.Context, mode string) error {
	if !s.running {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	s.logf("pgserver: stopping postgres on 127.0.0.1:%d (%s)", s.port, mode)
	wait := max(1, int(time.Until(deadline(ctx, stopTimeout)).Seconds()))
	_, err := s.run(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", mode, "-w", "-s", "-t", strconv.Itoa(wait))
	if err != nil && fileExists(filepath.Join(s.dataDir, "postmaster.pid")) {
		return err
	}
	s.running = false
	return nil
}

// stopQuietly stops a server whose start failed half-way, if it runs.
func (s *Server) stopQuietly() {
	if !fileExists(filepath.Join(s.dataDir, "postmaster.pid")) {
		s.running = false
		return
	}
	s.running = true
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := s.stop(ctx, "immediate"); err != nil {
		s.logf("pgserver: %v", err)
	}
}

// removeDirs removes what Start created.
func (s *Server) removeDirs() error {
	if s.removeDir == "" {
		return nil
	}
	dir := s.removeDir
	s.removeDir = ""
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pgserver: remove %s: %w", dir, err)
	}
	return nil
}

// run runs one of the server binaries as the server user and returns its
// combined output; the error includes that output.
func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runAs(ctx, s.cred, filepath.Join(s.binDir, name), args...)
}

func runAs(ctx context.Context, cred *syscall.Credential, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = "/" // the server user may not be able to enter our working directory
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG") // PGDATA, PGPORT, PGOPTIONS ... would override ours
	})
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	// The daemon pg_ctl starts has its output redirected to the log file;
	// WaitDelay guards against a pipe it might still hold.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("pgserver: %s %s: %w: %s", filepath.Base(path), strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// chown hands paths to the server user when running as root.
func (s *Server) chown(paths ...string) error {
	if s.cred == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: hand %s to user postgres: %w", p, err)
		}
	}
	return nil
}

// logTail returns the end of the server log, for error messages.
func (s *Server) logTail() string {
	f, err := os.Open(filepath.Join(s.dataDir, logFile))
	if err != nil {
		return "(no server log)"
	}
	defer f.Close()
	const tail = 4 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		_, _ = f.Seek(-tail, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return "server log " + filepath.Join(s.dataDir, logFile) + " ends with:\n" + string(bytes.TrimSpace(b))
}

// serverCredential returns the credential of the OS user postgres when the
// process runs as root, and nil otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, and initdb and postgres refuse to run as root: "+
			"create the OS user postgres (the Debian package postgresql does) or run as an ordinary user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgserver: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// findBinDir returns the directory holding pg_ctl, initdb and postgres.
func findBinDir(dir string) (string, error) {
	if dir != "" {
		if hasServerBinaries(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("pgserver: %w in %s: install the Debian package postgresql (apt-get install postgresql)", ErrNotInstalled, dir)
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServerBinaries(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if hasServerBinaries(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first: compare "15" and "9.6" numerically.
	version := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return -cmpFloat(version(a), version(b)) })
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgserver: %w on the PATH or in /usr/lib/postgresql/<version>/bin: "+
		"install the Debian package postgresql (apt-get install postgresql), or point DATABASE_URL at a server", ErrNotInstalled)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"pg_ctl", "initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// reapOrphans stops and removes the servers in os.TempDir()/pgtest-*
// whose owning process has exited without closing them (crash, timeout,
// interrupt). Best effort: failures are logged and ignored.
func reapOrphans(ctx context.Context, binDir string, cred *syscall.Credential, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPattern))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		data := filepath.Join(dir, "data")
		if fileExists(filepath.Join(data, "postmaster.pid")) {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := runAs(sctx, cred, filepath.Join(binDir, "pg_ctl"), "stop", "-D", data, "-m", "immediate", "-w", "-s", "-t", "5")
			cancel()
			if err != nil {
				logf("pgserver: stop server left by exited process %d: %v", pid, err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			logf("pgserver: remove %s left by exited process %d: %v", dir, pid, err)
			continue
		}
		logf("pgserver: removed %s left by exited process %d", dir, pid)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady connects and pings until it works or ctx ends.
func waitReady(ctx context.Context, url string) error {
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(actx, url)
		if err == nil {
			err = conn.Ping(actx)
			_ = conn.Close(actx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: postgres at %s not ready: %w (last error: %v)", url, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deadline returns ctx's deadline, or now+d when it has none.
func deadline(ctx context.Context, d time.Duration) time.Time {
	if t, ok := ctx.Deadline(); ok {
		return t
	}
	return time.Now().Add(d)
}

// confString quotes s as a postgresql.conf string value.
func confString(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
