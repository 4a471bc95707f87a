package pgcopy

import (
	"errors"
	"sync/atomic"
	"testing"
)

// TestReadAfterTheCopyReturnedEncodesNothing: pgconn's CopyFrom can return
// (a server or connection error) while its writing goroutine still reads
// the stream. Once From has ended the stream, such a Read fails without
// calling encode, synchronised with the end (CI's race detector: a Read
// raced the stream's release to the pool, where it would have encoded
// another COPY's rows).
func TestReadAfterTheCopyReturnedEncodesNothing(t *testing.T) {
	var calls atomic.Int64
	s := newStream(1, 1<<30, func(_ int, r *Row) {
		calls.Add(1)
		r.Text("x")
	})
	reading := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for i := 0; ; i++ {
			if i == 1 {
				close(reading)
			}
			if _, err := s.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	<-reading
	s.release(false) // as From does after an error
	after := calls.Load()
	if err := <-done; !errors.Is(err, errEnded) {
		t.Fatalf("Read after the end = %v, want errEnded", err)
	}
	if n := calls.Load(); n != after {
		t.Errorf("encode called %d times after the end", n-after)
	}
}
