// Package loopback finds free loopback ports for the servers that tests and
// benchmarks start (Redis, sentinels, nginx, Dropline itself).
//
// A port the kernel hands out for "127.0.0.1:0" comes from the same range
// as the local ports of outgoing connections, so between a probe's close and
// the server's bind any connection on the machine can take it, and the
// server exits. FreePort picks below that range, where only another server
// choosing a port can.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port FreePort hands out, above the ports services
// are usually configured on.
const lowest = 10000

// rangeFile holds the kernel's range of local ports for outgoing
// connections, "32768\t60999" by default.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// FreePort returns a loopback port nobody listens on now and no outgoing
// connection will be given, along with port+offset for each offset (a
// Redis Cluster node's bus port is its port + 10000). On a machine whose
// range leaves no room below it, the port is the kernel's choice, which an
// outgoing connection can still take.
func FreePort(offsets ...int) (int, error) {
	span := 0
	for _, o := range offsets {
		span = max(span, o)
	}
	top := ephemeralLow() - span // exclusive
	if top-lowest < 1000 {
		return kernelPort(offsets)
	}
	for range 200 {
		p := lowest + rand.IntN(top-lowest) //nolint:gosec // a port number, not a secret
		if free(p, offsets) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port found in %d–%d", lowest, top-1)
}

// ephemeralLow is the lowest local port of outgoing connections.
func ephemeralLow() int {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
}

// kernelPort is the fallback when the machine leaves no room below its
// range: a port the kernel picks.
func kernelPort(offsets []int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if free(p, offsets) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port found")
}

// free says whether port and port+each offset can be listened on now.
func free(port int, offsets []int) bool {
	for _, o := range append([]int{0}, offsets...) {
		if port+o > 65535 {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+o)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}
