//! What the unit tests share: a counting allocator (so a test can assert
//! how much memory a step took) and loop counts scaled down for Miri.

pub mod counting_alloc;

/// The unit tests count each thread's memory (see `counting_alloc`).
#[global_allocator]
static TEST_ALLOCATOR: counting_alloc::CountingAllocator = counting_alloc::CountingAllocator;

/// A test's loop count, cut to 1% under Miri (which interprets every
/// instruction, about 1,000x slower) so `script/memcheck` finishes.
pub const fn miri_scaled(n: usize) -> usize {
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

/// Lowers the process's address-space limit to `bytes` (the fuzz tests:
/// a reader that allocated past its budget must then fail to allocate
/// and abort the test, as it would abort the CLI under `ulimit -v`).
pub fn limit_address_space(bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct it is given; lowering the soft
    // limit needs no privilege. A failure leaves the limit as it was.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
}
