//! Benchmarks of shardgate. Nothing to link: the microbenchmarks are in `micro/` (run with
//! `cargo bench -p shardgate-benches`) and the whole-system comparisons are scripts beside
//! them; see `docs/benchmarks.md`.
