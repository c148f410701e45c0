//go:build !linux

package proxy

// lowersPriority: elsewhere than on Linux the workers and every loop run
// at the process's priority.
const lowersPriority = false

const asideNice, heavyNice = 0, 0

func lowerPriority(int) {}
