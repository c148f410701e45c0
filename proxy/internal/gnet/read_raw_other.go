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

//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package gnet

import "golang.org/x/sys/unix"

// readSocket reads from a connection's socket, as published gnet does.
func readSocket(fd int, p []byte) (int, error) { return unix.Read(fd, p) }
