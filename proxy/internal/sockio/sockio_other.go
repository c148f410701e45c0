//go:build !linux

package sockio

import "net"

// Quiet reports whether the socket under nc is open at both ends with
// nothing to read: it cannot tell outside Linux, and says yes.
func Quiet(nc net.Conn) bool { return true }
