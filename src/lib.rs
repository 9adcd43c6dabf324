//! memprofiler_pprof_rs: a sampling heap and allocation profiler for Ruby
//! that writes pprof profiles. This crate is the binding layer, the only
//! code that talks to Ruby; the layers below it are crates of their own
//! (crates/, ARCHITECTURE.md has the map), each depending only on those
//! below it, so the compiler refuses an import that runs back up:
//!
//! - `sampler`: plain Rust, no Ruby: which allocations to sample, the
//!   samples and their stacks, and the flush's read-out.
//! - `sampler_lock`: the lock around the sampler state.
//! - `pprof`: the pprof format: protobuf types, string table, gzip, and the
//!   heap profile built from a flush.
//! - `analysis`: reading profiles back (any tool's): top, diff, merge,
//!   flame graphs.
//!
//! All but this crate are unit-tested with `cargo test` without a Ruby VM;
//! `sampler`, `pprof` and `analysis` forbid `unsafe` (the lock and the
//! tests' helpers are the argued exceptions, ARCHITECTURE.md).

mod ruby;
