//! What std's vectors and hash maps hold on the heap, and what growing
//! them by some entries allocates, for code that must reserve memory from a
//! budget before it allocates (analysis::merge). Mirrors std's growth: a
//! vector's `reserve` takes the larger of what is asked and twice its
//! capacity; a hash map (hashbrown) has a power of two of buckets, 8 for
//! each 7 entries, one control byte per bucket and a group of 16 more.

use std::mem::size_of;

/// What malloc adds to each block (glibc: an 8-byte header, and sizes
/// rounded up to 16): a million small vectors take 16 MB more than their
/// contents.
pub const BLOCK_OVERHEAD: usize = 16;

/// Heap bytes of one allocation of `bytes` (none for an empty one).
pub fn block_bytes(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        bytes + BLOCK_OVERHEAD
    }
}

/// Buckets of a hash map whose `capacity()` is `capacity`.
fn buckets_of_capacity(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..=7 => capacity + 1,
        _ => capacity / 7 * 8,
    }
}

/// Buckets a hash map takes to hold `entries`.
fn buckets_for(entries: usize) -> usize {
    match entries {
        0..=3 => 4,
        4..=7 => 8,
        _ => (entries.saturating_mul(8) / 7).next_power_of_two(),
    }
}

fn table_bytes(buckets: usize, entry: usize) -> usize {
    if buckets == 0 {
        return 0;
    }
    buckets.saturating_mul(entry + 1) + 16 + 16
}

/// Heap bytes of a hash map of `capacity` with `entry`-byte entries (key
/// and value; what they own besides is the caller's to count).
pub fn map_bytes(capacity: usize, entry: usize) -> usize {
    table_bytes(buckets_of_capacity(capacity), entry)
}

/// What `reserve(incoming)` on a hash map of `len` entries and `capacity`
/// allocates (the old table is freed after the move).
pub fn map_growth(len: usize, capacity: usize, incoming: usize, entry: usize) -> usize {
    let needed = len.saturating_add(incoming);
    if needed <= capacity {
        return 0;
    }
    table_bytes(buckets_for(needed.max(capacity + 1)), entry)
}

/// Heap bytes of a vector.
pub fn vec_bytes<T>(vec: &Vec<T>) -> usize {
    vec.capacity() * size_of::<T>()
}

/// What `reserve(incoming)` on `vec` allocates.
pub fn vec_growth<T>(vec: &Vec<T>, incoming: usize) -> usize {
    let needed = vec.len().saturating_add(incoming);
    if needed <= vec.capacity() {
        return 0;
    }
    // (A vector's first capacity is at least 4, or 8 of bytes.)
    let least = match size_of::<T>() {
        1 => 8,
        2..=1024 => 4,
        _ => 1,
    };
    needed
        .max(vec.capacity().saturating_mul(2))
        .max(least)
        .saturating_mul(size_of::<T>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use test_support::counting_alloc::peak_bytes_during;

    #[test]
    fn growth_and_size_match_what_std_allocates() {
        type Entry = (u64, [u64; 3]);
        let entry = size_of::<Entry>();
        let mut map: HashMap<u64, [u64; 3]> = HashMap::new();
        let mut vec: Vec<Entry> = Vec::new();
        let mut next = 0u64;
        for incoming in [1usize, 2, 5, 9, 30, 100, 1_000, 3, 5_000, 20_000, 1] {
            let expected = map_growth(map.len(), map.capacity(), incoming, entry);
            let (_, peak) = peak_bytes_during(|| map.reserve(incoming));
            assert!(
                peak <= expected && expected <= peak + 32,
                "{incoming}: {peak} vs {expected}"
            );
            let expected = vec_growth(&vec, incoming);
            let old = vec_bytes(&vec);
            let (_, peak) = peak_bytes_during(|| vec.reserve(incoming));
            // (A realloc is counted by what it adds.)
            assert!(peak <= expected, "{incoming}");
            if expected > 0 {
                assert_eq!(expected, old + peak, "{incoming}: the new capacity");
            }
            for _ in 0..incoming {
                map.insert(next, [next; 3]);
                vec.push((next, [next; 3]));
                next += 1;
            }
            let table = map_bytes(map.capacity(), entry);
            let (copy, bytes) = peak_bytes_during(|| map.clone());
            assert!(
                bytes <= table && table <= bytes + 32,
                "{}: {bytes} vs {table}",
                map.len()
            );
            drop(copy);
            assert_eq!(vec_bytes(&vec), vec.capacity() * entry);
        }
    }
}
