//! Reading profiles back: decode any pprof (this gem's or another tool's),
//! and answer "what uses memory, and what grew?" without Go. Backs the
//! `memprofiler_pprof_rs` executable and `MemprofilerPprof::Profile`.

pub mod decoded_profile;
pub mod diff;
pub mod display;
pub mod flamegraph;
pub mod grouping;
#[cfg(test)]
mod hostile_input_tests;
pub mod merge;
pub mod top;
pub mod units;
