//! The Ruby-free core: everything here is plain Rust, unit-tested with
//! `cargo test` without a Ruby VM. Ruby objects appear only as opaque
//! integers (`FrameRef` for a frame, `ObjectAddress` for a sampled object);
//! the binding layer in `crate::ruby` is what knows they are VALUEs.

pub mod address_filter;
pub mod fast_hash;
pub mod lock;
pub mod pprof;
pub mod profile_builder;
pub mod sample_gate;
pub mod sampler_state;
pub mod stack_table;
pub mod string_table;
