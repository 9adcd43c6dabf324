//! memprofiler_pprof_rs: a sampling heap and allocation profiler for Ruby
//! that writes pprof profiles.
//!
//! - `core`: plain Rust, no Ruby: sampler state, stack table, interning and
//!   the pprof builder (unit-tested with `cargo test`).
//! - `ruby`: the binding layer, the only code that talks to Ruby.

pub mod core;
mod ruby;
