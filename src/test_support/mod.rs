//! What the unit tests share: a counting allocator (so a test can assert
//! how much memory a step took) and loop counts scaled down for Miri.

pub(crate) mod counting_alloc;

/// The unit tests count each thread's memory (see `counting_alloc`).
#[global_allocator]
static TEST_ALLOCATOR: counting_alloc::CountingAllocator = counting_alloc::CountingAllocator;

/// A test's loop count, cut to 1% under Miri (which interprets every
/// instruction, about 1,000x slower) so `script/memcheck` finishes.
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
