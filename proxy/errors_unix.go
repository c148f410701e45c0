package proxy

import "syscall"

// errTooManyFiles is the accept error worth waiting out: the process ran
// out of file descriptors, and closing connections will free some.
var errTooManyFiles error = syscall.EMFILE
