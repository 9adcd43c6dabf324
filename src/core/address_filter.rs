//! A one-bit-per-slot filter in front of the tracked-object maps, so that
//! FREEOBJ on an object the sampler does not track (nearly every free) costs
//! a hash, a load and a test, without the lock or a map lookup.
//!
//! A clear bit proves an address untracked; a set bit means "look in the
//! maps" (it may be stale or shared). Bits are never cleared one by one
//! (another tracked address may share them); the owner rebuilds the filter
//! from the tracked addresses once enough removals have made it stale.
//!
//! All access is through atomics, so the hook may read it without the
//! sampler's lock. Every writer and reader runs with Ruby's GVL held, so a
//! rebuild is never observed half-done.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sampler_state::ObjectAddress;

/// 2^20 bits (128 KiB): with the default 50,000 tracked objects, about 5%
/// of untracked frees still take the slow path.
pub const DEFAULT_BITS_LOG2: u32 = 20;

pub struct AddressFilter {
    words: Box<[AtomicU64]>,
    shift: u32,
}

impl std::fmt::Debug for AddressFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AddressFilter({} bits)", self.words.len() * 64)
    }
}

impl AddressFilter {
    pub fn new(bits_log2: u32) -> Self {
        assert!(
            (6..=32).contains(&bits_log2),
            "filter size 2^{bits_log2} bits"
        );
        let words = (0..(1usize << (bits_log2 - 6)))
            .map(|_| AtomicU64::new(0))
            .collect();
        AddressFilter {
            words,
            shift: 64 - bits_log2,
        }
    }

    #[inline]
    fn position(&self, address: ObjectAddress) -> (usize, u64) {
        // Object slots are 8-byte aligned: drop those bits, then spread the
        // rest over the table (Fibonacci hashing, top bits).
        let bit =
            ((address as u64 >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize;
        (bit >> 6, 1u64 << (bit & 63))
    }

    /// False: `address` is certainly not tracked.
    #[inline]
    pub fn may_contain(&self, address: ObjectAddress) -> bool {
        let (word, mask) = self.position(address);
        self.words[word].load(Ordering::Relaxed) & mask != 0
    }

    #[inline]
    pub fn insert(&self, address: ObjectAddress) {
        let (word, mask) = self.position(address);
        self.words[word].fetch_or(mask, Ordering::Relaxed);
    }

    /// Forgets everything, then inserts `addresses`.
    pub fn rebuild(&self, addresses: impl Iterator<Item = ObjectAddress>) {
        for word in self.words.iter() {
            word.store(0, Ordering::Relaxed);
        }
        for address in addresses {
            self.insert(address);
        }
    }

    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.words.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_addresses_are_always_found_and_most_others_are_not() {
        let filter = AddressFilter::new(16);
        let tracked: Vec<usize> = (0..2_000).map(|i| 0x7f00_0000_0000 + i * 40 * 7).collect();
        for &a in &tracked {
            filter.insert(a);
        }
        assert!(tracked.iter().all(|&a| filter.may_contain(a)));
        let others = (0..100_000usize).map(|i| 0x5500_0000_0000 + i * 40);
        let false_positives = others.filter(|&a| filter.may_contain(a)).count();
        // 2,000 of 65,536 bits set: about 3% expected.
        assert!(false_positives < 6_000, "{false_positives} false positives");
    }

    #[test]
    fn rebuild_forgets_removed_addresses() {
        let filter = AddressFilter::new(12);
        filter.insert(0x1000);
        filter.insert(0x2000);
        filter.rebuild([0x2000].into_iter());
        assert!(filter.may_contain(0x2000));
        assert!(!filter.may_contain(0x1000));
        assert_eq!(
            filter.memory_bytes(),
            std::mem::size_of::<AddressFilter>() + 512
        );
    }
}
