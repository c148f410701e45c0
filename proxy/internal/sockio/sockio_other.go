//go:build !linux

package sockio

import "net"

// Waiting reports whether bytes are waiting to be read in the socket
// under nc: it cannot tell outside Linux, and says no.
func Waiting(nc net.Conn) bool { return false }

// Quiet reports whether the socket under nc is open at both ends with
// nothing to read: it cannot tell outside Linux, and says yes.
func Quiet(nc net.Conn) bool { return true }
