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
// event loops on Unix hand it to their pollers. See README.md at the root
// of this copy.

//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package gnet

// PollEnder is an EventHandler that is told each time an event loop has
// handled every event one wait of its poller returned, and the tasks it
// ran after them, just before the loop waits again: work that the events
// made, such as writes to other connections, can be done once for all of
// them there.
//
// OnPollEnd runs on the event loop's goroutine. What it writes with
// Conn.Write goes out at once, as from OnTraffic; a task it queues runs
// after the next wait.
type PollEnder interface {
	OnPollEnd(el EventLoop)
}

// hookPollEnd has el's poller call the event handler's OnPollEnd, when it
// has one.
func (el *eventloop) hookPollEnd() {
	if h, ok := el.eventHandler.(PollEnder); ok {
		el.poller.OnPollEnd(func() { h.OnPollEnd(el) })
	}
}
