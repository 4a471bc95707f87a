// Package bench holds the worker's throughput benchmarks (make bench); it
// has no importable code. BenchmarkWorkerThroughput runs the built
// projection-worker binary as a subprocess against an in-process kfake
// broker and PostgreSQL, and compares it with raw pgx batched upserts of the
// same rows; BenchmarkWorkerInProcess runs the same worker in-process for
// go test -cpuprofile. Neither runs without -bench.
package bench
