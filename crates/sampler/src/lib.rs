//! Ruby-free sampling: which allocations to sample (`gaps`), the samples
//! and their deduplicated stacks (`state`, `stack_table`), and the address
//! filter the hooks use. Ruby objects appear only as opaque integers
//! (`types`); the binding crate is what knows they are VALUEs. Also the
//! two helpers every layer above uses: `fast_hash` and `heap_size`.

#![forbid(unsafe_code)]

pub mod address_filter;
pub mod block_frames;
pub mod fast_hash;
pub mod gaps;
pub mod heap_size;
pub mod id_slab;
pub mod label_sets;
pub mod named_classes;
pub mod reservoir;
pub mod sample_cost;
pub mod spread;
pub mod stack_table;
pub mod state;
pub mod threshold;

pub mod types;
pub mod windows;
