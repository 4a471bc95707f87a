// Package bench holds the worker's throughput benchmarks (make bench); it
// has no importable code. BenchmarkWorkerThroughput runs the built
// projection-worker binary as a subprocess against an in-process kfake
// broker and PostgreSQL, alternated with the raw methods that apply the
// same rows (pipelined statements and COPY plus one upsert, the worker's
// guard) and with poisoned and traced runs, and prints one table and one
// BENCH_JSON line; BenchmarkWorkerInProcess runs the worker in-process for
// go test -cpuprofile. None runs without -bench.
package bench
