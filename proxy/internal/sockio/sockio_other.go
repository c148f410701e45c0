//go:build !linux

package sockio

import "errors"

// Written counts bytes from the kernel's TCP state, which only Linux gives
// (TCP_INFO's bytes acknowledged, SIOCOUTQ): elsewhere it fails, and a
// connection that needs it is closed instead.
func Written(fd int) (uint64, error) {
	return 0, errors.ErrUnsupported
}
