//! Benchmarks only: see `benches/`. `cargo bench -p bench`.
