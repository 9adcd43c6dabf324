//! memprofiler_pprof_rs: a sampling heap and allocation profiler for Ruby
//! that writes pprof profiles. Four layers, each depending only on those
//! above it (ARCHITECTURE.md has the map):
//!
//! - `sampler`: plain Rust, no Ruby: which allocations to sample, the
//!   samples and their stacks, and the flush's read-out.
//! - `pprof`: the pprof format: protobuf types, string table, gzip, and the
//!   heap profile built from a flush.
//! - `analysis`: reading profiles back (any tool's): top, diff, merge,
//!   flame graphs.
//! - `ruby`: the binding layer, the only code that talks to Ruby.
//!
//! All but `ruby` are unit-tested with `cargo test` without a Ruby VM.

pub mod analysis;
pub mod fast_hash;
pub mod heap_size;
pub mod pprof;
mod ruby;
pub mod sampler;
#[cfg(test)]
pub(crate) mod test_support;
