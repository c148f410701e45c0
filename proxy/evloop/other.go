//go:build !linux

package evloop

import "net"

// Supported reports whether event loops run on this system.
const Supported = false

// Engine is a set of event loops; there is none without Linux.
type Engine struct{}

// New fails: event loops need Linux.
func New(Config, Handler) (*Engine, error) { return nil, errNeedsLinux }

// Enroll fails: event loops need Linux.
func (*Engine) Enroll(net.Conn, any) (*Conn, error) { return nil, errNeedsLinux }

// Stop does nothing.
func (*Engine) Stop() {}

// Loop is an event loop; there is none without Linux.
type Loop struct{}

// Execute fails: event loops need Linux.
func (*Loop) Execute(func()) error { return errNeedsLinux }

// Enroll fails: event loops need Linux.
func (*Loop) Enroll(net.Conn, any) (*Conn, error) { return nil, errNeedsLinux }

// Conn is a connection on a loop; there is none without Linux.
type Conn struct{}

func (*Conn) PauseReading()                {}
func (*Conn) ResumeReading()               {}
func (*Conn) Reading() bool                { return false }
func (*Conn) Context() any                 { return nil }
func (*Conn) SetContext(any)               {}
func (*Conn) Loop() *Loop                  { return nil }
func (*Conn) Fd() int                      { return -1 }
func (*Conn) Dup() (int, error)            { return -1, errNeedsLinux }
func (*Conn) InboundBuffered() int         { return 0 }
func (*Conn) Peek() []byte                 { return nil }
func (*Conn) Discard(int)                  {}
func (*Conn) OutboundBuffered() int        { return 0 }
func (*Conn) Write([]byte) (int, error)    { return 0, errNeedsLinux }
func (*Conn) Writev([][]byte) (int, error) { return 0, errNeedsLinux }
func (*Conn) Flush() error                 { return errNeedsLinux }
func (*Conn) Close()                       {}
