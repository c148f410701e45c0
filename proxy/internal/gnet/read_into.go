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
// event loop's read on Unix asks it for the buffer to read into. See
// README.md at the root of this copy.

package gnet

// ReadIntoer is an EventHandler that may choose, for a connection's next
// read, the buffer the bytes are read into, instead of the event loop's
// own: a long message then lands where it is kept, without being copied
// out of the loop's buffer in OnTraffic.
//
// ReadInto runs on the connection's event loop just before each read.
// When it returns a buffer that is not empty, the read goes into it (at
// most len of it), and Conn.Next, Peek and the like return those bytes in
// OnTraffic as they do the loop's buffer. What OnTraffic leaves unread is
// copied into the connection's inbound buffer as ever, so the buffer may
// be reused once OnTraffic returns. There is no point in returning one
// while the inbound buffer holds bytes: Peek then copies the older bytes
// and the new ones into a buffer of its own, in order, which is correct
// but saves nothing. Returning nil reads into the loop's buffer, as
// published.
type ReadIntoer interface {
	ReadInto(c Conn) []byte
}
