//go:build race

package tier

// raceEnabled skips or shortens tests that would take long under the race
// detector.
const raceEnabled = true
