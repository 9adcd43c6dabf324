//! The unit tests' allocator: the system's, counting the bytes each thread
//! holds, so a test can put a ceiling on the memory a piece of code takes
//! (`peak_bytes_during`) as well as on its results. Only in `cargo test`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct CountingAllocator;

thread_local! {
    /// Bytes this thread allocated minus those it freed (a block freed by
    /// another thread skews both threads' counts; the code measured here is
    /// single-threaded).
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // try_with: the slots can be gone while a thread is torn down.
    let _ = HELD.try_with(|held| {
        let now = held.get().wrapping_add(delta);
        held.set(now);
        let _ = PEAK.try_with(|peak| {
            if now > peak.get() {
                peak.set(now);
            }
        });
    });
}

// SAFETY: every method forwards to System with the caller's arguments
// unchanged and only updates thread-local counters besides.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            note(layout.size() as isize);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            note(layout.size() as isize);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(block, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// Bytes this thread holds now (allocated minus freed).
pub fn held_bytes() -> isize {
    HELD.with(Cell::get)
}

/// `work`'s result, and the most bytes this thread held at once while it
/// ran, beyond what it held before.
pub fn peak_bytes_during<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let result = work();
    let peak = PEAK.with(Cell::get);
    (result, (peak - before).max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_a_closure_holds_at_its_peak() {
        let (_, peak) = peak_bytes_during(|| {
            let big = vec![0u8; 10 << 20];
            drop(big);
            let small = vec![0u8; 1 << 20];
            small.len()
        });
        assert!((10 << 20..11 << 20).contains(&peak), "{peak}");
    }
}
