package testenv

import (
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// takenPorts makes choosePort hand out a port another socket holds first,
// then free ones; it returns the taken port.
func takenPorts(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	taken := l.Addr().(*net.TCPAddr).Port
	handOutFirst(t, taken)
	return taken
}

// handOutFirst makes choosePort hand out taken first, then free ports.
func handOutFirst(t *testing.T, taken int) {
	t.Helper()
	first := true
	choosePort = func(args []string) (int, error) {
		if first {
			first = false
			return taken, nil
		}
		return freePort(args)
	}
	t.Cleanup(func() { choosePort = freePort })
}

// A server whose port was taken between freePort's probe and its bind exits
// at once; the start sees that, without waiting out its deadline, and tries
// another port.
func TestAServerWhosePortIsTakenStartsOnAnother(t *testing.T) {
	taken := takenPorts(t)
	start := time.Now()
	s, err := startServer(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	require.NotEqual(t, taken, s.Port)
	// Half of waitPing's 10 s: two starts on a loaded machine fit, and a
	// deadline waited out does not.
	require.Less(t, time.Since(start), 5*time.Second, "the exit was seen, not waited out")
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	require.NoError(t, c.Ping(t.Context()).Err())
}

// A port another test's Redis took first answers PING too; the start
// sees that the answer is not its own process's and moves on.
func TestAServerWhosePortAnotherServerAnswersOnStartsOnAnother(t *testing.T) {
	other, err := startServer(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(other.Stop)
	handOutFirst(t, other.Port)
	s, err := startServer(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	require.NotEqual(t, other.Port, s.Port)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(t.Context(), "server").Result()
	require.NoError(t, err)
	require.Contains(t, info, "process_id:"+strconv.Itoa(s.proc.cmd.Process.Pid)+"\r\n", "the server on its address is its own")
}

func TestASentinelWhosePortIsTakenStartsOnAnother(t *testing.T) {
	primary, err := startServer(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(primary.Stop)
	taken := takenPorts(t)
	s, err := startSentinel(t.TempDir(), primary.Port, time.Second)
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	require.NotEqual(t, "127.0.0.1:"+strconv.Itoa(taken), s.Addr)
	require.NoError(t, s.waitKnows(0, 0))
}

// The reason a process gave for exiting is in the error.
func TestAnExitedServerSaysWhy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	s := &Server{Addr: l.Addr().String(), Port: port, dir: t.TempDir()}
	s.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--dir", s.dir, "--logfile", s.dir + "/redis.log"}
	err = s.Start()
	require.True(t, errors.Is(err, errExited), "got %v", err)
	require.Contains(t, err.Error(), "its log ends: ")
	require.Contains(t, err.Error(), strconv.Itoa(port), "the log line names the port it could not listen on")
}
