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

// This file is not part of gnet as published: mcsidecar added it. See
// README.md at the root of this copy.

package gnet

import (
	"syscall"
	"unsafe"
)

// readSocket reads from a connection's socket, which is non-blocking: the
// call returns at once, with what is there or EAGAIN. It is made without
// telling the Go scheduler (unix.Read does, which costs two runtime calls
// around every read): a call that cannot block has no P to hand over.
func readSocket(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if errno != 0 {
		return -1, errno
	}
	return int(n), nil
}
