package faults

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/dropline/dropline/internal/testenv"
)

// long enables the long variants of each scenario (more buyers, more
// faults, longer pauses). CI runs the short ones.
var long = flag.Bool("faults.long", false, "run the long variants of the fault scenarios")

// binary is the path of the dropline binary TestMain built.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "dropline-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "dropline")
	if runtime.GOOS == "windows" {
		binary += ".exe"
	}
	// The race detector in the binary too: a data race under a fault is a bug
	// the fault found.
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/dropline/dropline/cmd/dropline")
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "faults: building dropline:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	testenv.DropTemplates()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
