package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// errExited is a server process that ended before it answered, or whose
// port answered for another process. Most often another server, started by
// a test of a package running beside it, took the same port between the
// probe and the bind, so the callers that chose the port try another one.
var errExited = errors.New("exited before it answered")

// choosePort picks the port of a new server: freePort, or a test's choice.
var choosePort = freePort

// portAttempts is how many free ports a new server is tried on before its
// start fails.
const portAttempts = 5

// onFreePort calls start with a port from choosePort, and again with
// another while start reports errExited, portAttempts times at most.
func onFreePort(args []string, start func(port int) error) error {
	var err error
	for range portAttempts {
		var port int
		if port, err = choosePort(args); err != nil {
			return err
		}
		if err = start(port); !errors.Is(err, errExited) {
			return err
		}
	}
	return err
}

// process is a server process a test owns: started, watched for an early
// exit, signalled and killed.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startProcess(path string, args ...string) (*process, error) {
	cmd := exec.Command(path, args...) //nolint:gosec // test helpers run redis-server and redis-sentinel with arguments they built
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(path), err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// waitPing waits until the Redis or sentinel at addr answers PING, and
// that the answer is this process's (INFO's process_id). It returns
// errExited as soon as the process ends first, or when another process
// answers on its port, and names log, the process's log file, so the
// reason it gave is in the failure.
func (p *process) waitPing(addr, log string, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c.Close()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("%s on %s %w: %s", filepath.Base(p.cmd.Path), addr, errExited, lastLine(log))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return p.answersOn(c, addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s on %s did not answer: %w", filepath.Base(p.cmd.Path), addr, err)
}

// answersOn checks that the server answering on addr is this process: a
// server of another test that took the port first answers PING too, while
// this one exits on its bind. The caller stops the process on an error.
func (p *process) answersOn(c *redis.Client, addr, log string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("INFO server of %s: %w", addr, err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if pid, ok := strings.CutPrefix(line, "process_id:"); ok {
			if pid == strconv.Itoa(p.cmd.Process.Pid) {
				return nil
			}
			return fmt.Errorf("%s on %s %w: another process (pid %s) answers on its port; %s",
				filepath.Base(p.cmd.Path), addr, errExited, pid, lastLine(log))
		}
	}
	return fmt.Errorf("INFO server of %s names no process_id", addr)
}

// alive is false once the process has ended.
func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *process) signal(sig os.Signal) { _ = p.cmd.Process.Signal(sig) }

// kill ends the process (SIGKILL) and waits until it is gone.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// lastLine is the last non-empty line of a log file, or why there is none.
func lastLine(path string) string {
	b, err := os.ReadFile(path) //nolint:gosec // a log file the test helper named
	if err != nil {
		return "no log: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "its log ends: " + lines[len(lines)-1]
}
