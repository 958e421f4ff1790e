//go:build !unix

package flashsale

import "time"

// processCPU is not measured here: the driver's CPU per change reads 0.
func processCPU() time.Duration { return 0 }
