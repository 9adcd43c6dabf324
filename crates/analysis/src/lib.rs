//! Reading profiles back: decode any pprof (this gem's or another tool's),
//! and answer "what uses memory, and what grew?" without Go. Backs the
//! `memprofiler_pprof_rs` executable and `MemprofilerPprof::Profile`.

#![forbid(unsafe_code)]

/// Maps keyed by what a profile file holds (ids, strings, line numbers):
/// std's randomly keyed SipHash, so a crafted file cannot make its keys
/// collide and each insert cost as much as the map is long (the sampler's
/// FastHashMap is FxHash, for addresses nobody chooses).
pub type InputMap<K, V> = std::collections::HashMap<K, V>;
pub type InputSet<K> = std::collections::HashSet<K>;

pub mod decoded_profile;
pub mod diff;
pub mod display;
pub mod flamegraph;
pub mod focus;
pub mod grouping;
mod growth_test;
#[cfg(test)]
mod hostile_input_tests;
pub mod memory_estimate;
pub mod merge;
pub mod read_budget;
pub mod top;
pub mod units;
