package upstream

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
)

// The replies of memcached 1.6 that the upstream side reads.
var (
	crlf          = []byte("\r\n")
	replyEnd      = []byte("END\r\n")
	replyOK       = []byte("OK\r\n")
	replyValue    = []byte("VALUE ")
	replyTooLarge = []byte("SERVER_ERROR object too large for cache\r\n")
	metaValue     = []byte("VA ")
	metaMiss      = []byte("EN\r\n")
	metaExists    = []byte("EX\r\n")
	metaNotFound  = []byte("NF\r\n")
	metaNotStore  = []byte("NS\r\n")
	// storedWithCAS begins the answer to a meta set that asked for the
	// new CAS value ("HD c<cas>").
	storedWithCAS = []byte("HD c")
)

// RelayedLine finds the SERVER_ERROR or CLIENT_ERROR line quoted in the
// error of a request that memcached answered with a reply other than the
// one expected (the meta commands of a read-modify-write), so that a
// client sees memcached's own words (for example "object too large for
// cache").
func RelayedLine(msg string) ([]byte, bool) {
	i := strings.LastIndex(msg, ": \"")
	if i < 0 {
		return nil, false
	}
	line, err := strconv.Unquote(msg[i+2:])
	if err != nil {
		return nil, false
	}
	if !strings.HasPrefix(line, "SERVER_ERROR ") && !strings.HasPrefix(line, "CLIENT_ERROR ") {
		return nil, false
	}
	if !strings.HasSuffix(line, "\r\n") {
		line += "\r\n"
	}
	return []byte(line), true
}

// isConnError reports whether err is a broken connection (reset, closed,
// refused) rather than a timeout or a reply: what a restarted server
// leaves behind in every pooled connection.
func isConnError(err error) bool {
	if err == nil || IsTimeout(err) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// IsTimeout reports whether err is a request that ran out of time.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
