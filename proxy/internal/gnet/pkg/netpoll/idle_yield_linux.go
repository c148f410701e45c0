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
// epoll pollers call it where they called runtime.Gosched, and for the
// timeout of their epoll_wait once they have handled events, which was 0.
// See README.md at the root of this copy.

//go:build linux

package netpoll

import (
	"runtime"
	"sync/atomic"
	"time"
)

// yieldEvery is how often, at most, a poller that finds nothing ready
// yields to the Go scheduler before it blocks in epoll_wait, while
// GOMAXPROCS leaves a P to spare.
//
// Published gnet yields every time. When a P is idle, each runtime.Gosched
// wakes a thread to run it (golang/go#13527); the thread finds nothing to
// do and sleeps again, and the loop's goroutine may move to it: two futex
// calls and two context switches each time the loop falls idle, many
// thousand times a second under load. Blocking in epoll_wait gives the P
// up anyway. Yielding now and then still lets the scheduler see the loop
// go through it, so that sysmon does not take its P away every 10 ms as
// from a goroutine that never yields.
//
// The price is paid by goroutines the loop makes runnable (a channel send
// to one waiting for it): the loop's P holds them, and while it blocks
// they wait for the spare P's thread to take them, or for sysmon.
const yieldEvery = 5 * time.Millisecond

// pollers counts the pollers polling in the process.
var pollers atomic.Int32

// idleYield is what one poller does before it blocks.
type idleYield struct {
	last time.Time // when it last yielded
	// every: yield every time nothing is ready, as published gnet does.
	// That is right while every P may be running a poller: no thread is
	// woken by a yield then, and what the loop made runnable runs before
	// it blocks. Read again at each yield: runtime.GOMAXPROCS takes a lock.
	every bool
}

func pollingStarts() *idleYield {
	pollers.Add(1)
	return &idleYield{}
}

func (y *idleYield) stops() { pollers.Add(-1) }

// afterEvents is the timeout of the poller's epoll_wait once it has handled
// what was ready. Published gnet polls once more without waiting (0), to
// yield before it blocks when nothing is; that is done here when a yield is
// due. Otherwise the call waits (-1): it returns at once with what is
// ready and blocks when nothing is, so the poll that would find nothing, a
// system call each time the loop falls idle, is not made.
func (y *idleYield) afterEvents() int {
	if y.every || time.Since(y.last) >= yieldEvery {
		return 0
	}
	return -1
}

// beforeBlocking yields every time when every says so, and otherwise at
// most once every yieldEvery.
func (y *idleYield) beforeBlocking() {
	now := time.Now()
	if !y.every && now.Sub(y.last) < yieldEvery {
		return
	}
	y.last = now
	y.every = runtime.GOMAXPROCS(0) <= int(pollers.Load())
	runtime.Gosched()
}
