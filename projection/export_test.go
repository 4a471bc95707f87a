package projection

import "time"

// SetSlowWork sets how long a partition's batch may take before it is
// said to take long (watchSlow) and returns a func that restores it. For
// tests that do not run in parallel.
func SetSlowWork(d time.Duration) (restore func()) {
	old := slowWork.Swap(int64(d))
	return func() { slowWork.Store(old) }
}

// SetHighWatermarkEvery sets how often the worker refreshes its partitions'
// high watermarks from the broker and returns a func that restores it. For
// tests that do not run in parallel.
func SetHighWatermarkEvery(d time.Duration) (restore func()) {
	old := highWatermarkEvery.Swap(int64(d))
	return func() { highWatermarkEvery.Store(old) }
}
