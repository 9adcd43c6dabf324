//! A small, fast, non-cryptographic hasher for integer-keyed maps on the
//! allocation path (object addresses, frame handles). SipHash's flood
//! resistance buys nothing here: keys are addresses, not attacker input.

/// rustc's multiply-add hash ("FxHash", the rustc-hash crate): one
/// multiplication per word.
pub use rustc_hash::FxHasher as FastHasher;

pub type FastHashMap<K, V> = rustc_hash::FxHashMap<K, V>;
pub type FastHashSet<K> = rustc_hash::FxHashSet<K>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{Hash, Hasher};

    fn hash_of<T: Hash>(value: T) -> u64 {
        let mut hasher = FastHasher::default();
        value.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn equal_keys_hash_equal_and_neighbours_differ() {
        assert_eq!(hash_of(0x7f00_1000usize), hash_of(0x7f00_1000usize));
        assert_ne!(hash_of(0x7f00_1000usize), hash_of(0x7f00_1028usize));
        assert_ne!(hash_of([1u64, 2]), hash_of([2u64, 1]));
    }

    #[test]
    fn map_works_with_address_keys() {
        let mut map: FastHashMap<usize, u32> = FastHashMap::default();
        for i in 0..10_000usize {
            map.insert(0x7f00_0000 + i * 40, i as u32);
        }
        assert_eq!(map.len(), 10_000);
        assert_eq!(map[&(0x7f00_0000 + 9_999 * 40)], 9_999);
    }
}
