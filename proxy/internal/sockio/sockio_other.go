//go:build !linux

package sockio

import (
	"errors"
	"net"
)

// Written counts bytes from the kernel's TCP state, which only Linux gives
// (TCP_INFO's bytes acknowledged, SIOCOUTQ): elsewhere it fails, and a
// connection that needs it is closed instead.
func Written(fd int) (uint64, error) {
	return 0, errors.ErrUnsupported
}

// Waiting reports whether bytes are waiting to be read in the socket
// under nc: it cannot tell outside Linux, and says no.
func Waiting(nc net.Conn) bool { return false }

// Quiet reports whether the socket under nc is open at both ends with
// nothing to read: it cannot tell outside Linux, and says yes.
func Quiet(nc net.Conn) bool { return true }
