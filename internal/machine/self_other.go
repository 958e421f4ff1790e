//go:build !unix

package machine

import "time"

// SelfCPU is not measured here: it reads 0.
func SelfCPU() time.Duration { return 0 }
