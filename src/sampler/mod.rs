//! Ruby-free sampling: which allocations to sample (`gaps`), the samples
//! and their deduplicated stacks (`state`, `stack_table`), and the lock and
//! address filter the hooks use. Ruby objects appear only as opaque
//! integers (`types`); the binding layer in `crate::ruby` is what knows
//! they are VALUEs.

pub mod address_filter;
pub mod block_frames;
pub mod gaps;
pub mod id_slab;
pub mod label_sets;
pub mod lock;
pub mod named_classes;
pub mod reservoir;
pub mod sample_cost;
pub mod spread;
pub mod stack_table;
pub mod state;
pub mod threshold;

pub mod types;
pub mod windows;
