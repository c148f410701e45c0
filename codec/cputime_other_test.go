//go:build !linux

package codec

import "time"

// threadCPU is not measured here: benchmarks report wall time only.
func threadCPU() time.Duration { return 0 }
