//go:build race

package proxy

// raceEnabled says the race detector is on: it roughly doubles what each
// goroutine and object costs, so memory bounds are looser under it.
const raceEnabled = true
