//go:build race

package keyspace

// raceEnabled shortens tests that would take long under the race detector.
const raceEnabled = true
