//go:build !linux

package main

import "time"

// preparePacing has nothing to do: the event loops, and so the open loop,
// run on Linux only.
func preparePacing() {}

func sleepPrecisely(d time.Duration) { time.Sleep(d) }
