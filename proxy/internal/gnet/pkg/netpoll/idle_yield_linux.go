// Copyright (c) 2026 The mcsidecar authors
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//	http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// This file is not part of gnet as published: mcsidecar added it, and the
// epoll pollers call it where they called runtime.Gosched. See README.md
// at the root of this copy.

//go:build linux

package netpoll

import (
	"runtime"
	"time"
)

// yieldEvery is how often, at most, a poller that finds nothing ready
// yields to the Go scheduler before it blocks in epoll_wait.
//
// Published gnet yields every time. When GOMAXPROCS leaves a P idle, each
// runtime.Gosched wakes a thread to run that P (golang/go#13527); it finds
// nothing to do and sleeps again, and the loop's goroutine may move to it:
// two futex calls and two context switches each time the loop falls idle,
// many thousand times a second under load. Blocking in epoll_wait gives the
// P up anyway. Yielding now and then still lets the scheduler see the loop
// go through it, so that sysmon does not take its P away every 10 ms as
// from a goroutine that never yields.
const yieldEvery = 5 * time.Millisecond

// idleYield yields at most once every yieldEvery.
type idleYield struct{ last time.Time }

func (y *idleYield) beforeBlocking() {
	if now := time.Now(); now.Sub(y.last) >= yieldEvery {
		y.last = now
		runtime.Gosched()
	}
}
