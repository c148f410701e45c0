//go:build !linux

package proxy

// lowersPriority: elsewhere than on Linux the workers run at the loops'
// priority.
const lowersPriority = false

func lowerPriority() {}
