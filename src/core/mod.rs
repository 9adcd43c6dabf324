//! The Ruby-free core: everything here is plain Rust, unit-tested with
//! `cargo test` without a Ruby VM. Ruby objects appear only as opaque
//! integers (`FrameRef` for a frame, `ObjectAddress` for a sampled object);
//! the binding layer in `crate::ruby` is what knows they are VALUEs.

pub mod address_filter;
pub mod analysis;
pub mod block_frames;
pub mod fast_hash;
pub mod lock;
pub mod named_classes;
pub mod pprof;
pub mod profile_builder;
pub mod sample_gate;
pub mod sampler_state;
pub mod stack_table;
pub mod string_table;
#[cfg(test)]
pub(crate) mod test_alloc;

/// The unit tests count each thread's memory (see `test_alloc`).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: test_alloc::CountingAllocator = test_alloc::CountingAllocator;

/// A test's loop count, cut to 1% under Miri (which interprets every
/// instruction, about 1,000x slower) so `script/memcheck` finishes.
#[cfg(test)]
pub(crate) const fn miri_scaled(n: usize) -> usize {
    if cfg!(miri) {
        if n >= 100 {
            n / 100
        } else {
            1
        }
    } else {
        n
    }
}
