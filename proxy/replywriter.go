package proxy

// replyWriter gathers the reply a handler writes (stats, version, a
// refusal, a meta reply made from memcached's), which the loop then puts
// in its place among the client's replies (see loopClient.local).
type replyWriter struct {
	buf []byte
}

// Write appends b to the reply. It never fails.
func (w *replyWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	return len(b), nil
}
