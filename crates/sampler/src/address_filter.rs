//! A counting filter in front of the tracked-object maps, so that FREEOBJ
//! on an object the sampler does not track (nearly every free) costs a
//! hash, a load and a compare, without the lock or a map lookup.
//!
//! Each bucket counts the tracked addresses that hash to it: zero proves an
//! address untracked; non-zero means "look in the maps". Counts go down
//! when addresses stop being tracked, so the filter never goes stale (a
//! plain bit filter would: Ruby reuses the same hot slots over and over, so
//! stale bits sit exactly where the next frees happen). A bucket that
//! reaches 255 stays there (conservative) until the next rebuild.
//!
//! All access is through atomics, so the hook may read it without the
//! sampler's lock. Every writer and reader runs with Ruby's GVL held, so a
//! rebuild is never observed half-done.

use std::sync::atomic::{AtomicU8, Ordering};

use super::types::ObjectAddress;

/// 2^18 buckets (256 KiB): with 1,000 tracked objects about 0.4% of
/// untracked frees take the slow path; with the default cap of 50,000
/// tracked, about 17%.
pub const DEFAULT_BUCKETS_LOG2: u32 = if cfg!(miri) {
    // Miri interprets every byte's initialisation: a small filter keeps the
    // core's tests runnable there (script/memcheck); correctness is the same.
    10
} else {
    18
};

const SATURATED: u8 = u8::MAX;

pub struct AddressFilter {
    counts: Box<[AtomicU8]>,
    log2: u32,
    mask: u64,
}

impl std::fmt::Debug for AddressFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AddressFilter({} buckets)", self.counts.len())
    }
}

impl AddressFilter {
    pub fn new(buckets_log2: u32) -> Self {
        assert!(
            (4..=32).contains(&buckets_log2),
            "filter size 2^{buckets_log2}"
        );
        let counts = (0..(1usize << buckets_log2))
            .map(|_| AtomicU8::new(0))
            .collect();
        AddressFilter {
            counts,
            log2: buckets_log2,
            mask: (1u64 << buckets_log2) - 1,
        }
    }

    /// One bucket per 32-byte granule of address space (Ruby's object slots
    /// are 40 bytes or more, so no two share one), wrapping around every
    /// `buckets * 32` bytes, with each such region's order scrambled by a
    /// hash of the region (XOR keeps aligned 64-bucket blocks together).
    /// Hence the GC's sweep, which frees slot after slot through a heap page,
    /// reads the table sequentially, a cache line per ~50 frees, instead of
    /// missing the cache on every free as a fully hashed index would.
    #[inline]
    fn bucket(&self, address: ObjectAddress) -> &AtomicU8 {
        let granule = address.0 as u64 >> 5;
        let region = granule >> self.log2;
        let scramble = region.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        &self.counts[((granule ^ scramble) & self.mask) as usize]
    }

    /// False: `address` is certainly not tracked.
    #[inline]
    pub fn may_contain(&self, address: ObjectAddress) -> bool {
        self.bucket(address).load(Ordering::Relaxed) != 0
    }

    /// `address` starts being tracked.
    #[inline]
    pub fn insert(&self, address: ObjectAddress) {
        let bucket = self.bucket(address);
        let count = bucket.load(Ordering::Relaxed);
        if count != SATURATED {
            bucket.store(count + 1, Ordering::Relaxed);
        }
    }

    /// `address`, inserted before, stops being tracked.
    #[inline]
    pub fn remove(&self, address: ObjectAddress) {
        let bucket = self.bucket(address);
        let count = bucket.load(Ordering::Relaxed);
        debug_assert!(count > 0, "removing an address never inserted");
        if count != SATURATED && count > 0 {
            bucket.store(count - 1, Ordering::Relaxed);
        }
    }

    /// Forgets everything, then inserts `addresses`.
    pub fn rebuild(&self, addresses: impl Iterator<Item = ObjectAddress>) {
        for count in self.counts.iter() {
            count.store(0, Ordering::Relaxed);
        }
        for address in addresses {
            self.insert(address);
        }
    }

    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.counts.len()
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
            filter.insert(ObjectAddress(a));
        }
        assert!(tracked
            .iter()
            .all(|&a| filter.may_contain(ObjectAddress(a))));
        let checked = test_support::miri_scaled(100_000);
        // Spread over the same range however many are checked (fewer under
        // Miri): neighbouring addresses share buckets' neighbourhoods.
        let stride = 40 * (100_000 / checked);
        let others = (0..checked).map(|i| 0x5500_0000_0000 + i * stride);
        let false_positives = others
            .filter(|&a| filter.may_contain(ObjectAddress(a)))
            .count();
        // 2,000 of 65,536 buckets used: about 3% expected.
        assert!(
            false_positives < checked * 6 / 100,
            "{false_positives} false positives"
        );
    }

    #[test]
    fn removal_empties_a_bucket_only_when_no_other_address_remains() {
        let filter = AddressFilter::new(4); // 16 buckets: collisions certain
        let addresses: Vec<usize> = (0..64).map(|i| 0x1000 + i * 40).collect();
        for &a in &addresses {
            filter.insert(ObjectAddress(a));
        }
        for (i, &a) in addresses.iter().enumerate() {
            filter.remove(ObjectAddress(a));
            // Everything not yet removed is still found.
            assert!(addresses[i + 1..]
                .iter()
                .all(|&b| filter.may_contain(ObjectAddress(b))));
        }
        assert!(addresses
            .iter()
            .all(|&a| !filter.may_contain(ObjectAddress(a))));
    }

    #[test]
    fn a_saturated_bucket_stays_set_until_rebuilt() {
        let filter = AddressFilter::new(4);
        let address = 0x2000;
        for _ in 0..300 {
            filter.insert(ObjectAddress(address));
        }
        for _ in 0..300 {
            filter.remove(ObjectAddress(address));
        }
        assert!(filter.may_contain(ObjectAddress(address)));
        filter.rebuild(std::iter::empty());
        assert!(!filter.may_contain(ObjectAddress(address)));
        assert_eq!(
            filter.memory_bytes(),
            std::mem::size_of::<AddressFilter>() + 16
        );
    }
}
