//! The live map: each tracked object's address to its sample.
//!
//! Inserts run in the NEWOBJ hook. A hash map that is full rehashes every
//! entry into a table twice its size inside the insert that found it full
//! (about 20 ms at a million entries, with the GVL held, in one
//! allocation). This one moves to the bigger table a little at a time
//! instead: the full table becomes `previous`, new entries go to
//! `current`, and each later insert first moves the entries of the next
//! `MOVE_STEP` records (SamplerState::move_live_step, which knows the
//! records) until none is left. Lookups and removals look in both.
//!
//! Small tables grow the ordinary way: below `MOVE_FROM` entries a rehash
//! takes microseconds.

use super::SampleId;
use crate::fast_hash::FastHashMap;
use crate::types::ObjectAddress;

/// Tables at least this full grow by moving; smaller ones rehash.
const MOVE_FROM: usize = 4_096;

/// Records whose objects each insert moves while moving.
pub(super) const MOVE_STEP: usize = 1_024;

#[derive(Debug, Default)]
pub(super) struct LiveMap {
    current: FastHashMap<ObjectAddress, SampleId>,
    /// The table `current` outgrew, while its entries move over.
    previous: FastHashMap<ObjectAddress, SampleId>,
    /// While moving: the record whose object moves next.
    move_from: usize,
}

impl LiveMap {
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, object: &ObjectAddress) -> Option<&SampleId> {
        self.current
            .get(object)
            .or_else(|| self.previous.get(object))
    }

    #[cfg(test)]
    pub fn contains_key(&self, object: &ObjectAddress) -> bool {
        self.get(object).is_some()
    }

    pub fn remove(&mut self, object: &ObjectAddress) -> Option<SampleId> {
        match self.current.remove(object) {
            Some(id) => Some(id),
            None if !self.previous.is_empty() => self.take_previous(object),
            None => None,
        }
    }

    /// Maps `object` to `id`; returns what it mapped to before.
    pub fn insert(&mut self, object: ObjectAddress, id: SampleId) -> Option<SampleId> {
        // (Mapped already: a new id takes no room, so nothing grows.)
        if let Some(slot) = self.current.get_mut(&object) {
            return Some(std::mem::replace(slot, id));
        }
        let stale = if self.previous.is_empty() {
            None
        } else {
            self.take_previous(&object)
        };
        if self.current.len() >= MOVE_FROM && self.current.len() == self.current.capacity() {
            // (Still moving from the last growth: finish it first. Only a
            // slab of records far larger than the map gets here.)
            self.finish_moving();
            let capacity = self.current.capacity().saturating_mul(2);
            let bigger = FastHashMap::with_capacity_and_hasher(capacity, Default::default());
            self.previous = std::mem::replace(&mut self.current, bigger);
            self.move_from = 0;
        }
        self.current.insert(object, id).or(stale)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ObjectAddress> {
        self.current.keys().chain(self.previous.keys())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectAddress, &SampleId)> {
        self.current.iter().chain(self.previous.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &SampleId> {
        self.current.values().chain(self.previous.values())
    }

    /// Entries the tables have room for (for the memory estimate).
    pub fn capacity(&self) -> usize {
        self.current.capacity() + self.previous.capacity()
    }

    /// While moving: the record whose object moves next.
    pub fn moving_from(&self) -> Option<usize> {
        (!self.previous.is_empty()).then_some(self.move_from)
    }

    /// Moves `object`'s entry, if it is still in the previous table.
    pub fn move_entry(&mut self, object: ObjectAddress) {
        if let Some(id) = self.take_previous(&object) {
            self.current.insert(object, id);
        }
    }

    /// Takes `object`'s entry out of the previous table, and lets the table
    /// go once it is empty (the newest records' entries are in `current`
    /// already, so the last one often moves well before the last record).
    fn take_previous(&mut self, object: &ObjectAddress) -> Option<SampleId> {
        let id = self.previous.remove(object);
        if id.is_some() && self.previous.is_empty() {
            self.previous = FastHashMap::default();
        }
        id
    }

    /// The records before `record` have been moved; `last` if there are
    /// no more records (what is left, if anything, moves now).
    pub fn moved_up_to(&mut self, record: usize, last: bool) {
        self.move_from = record;
        if last {
            self.finish_moving();
        }
    }

    /// Whether `current` is still full once `object` is removed.
    #[cfg(test)]
    pub fn full_after_removing(&self, object: &ObjectAddress) -> bool {
        let mut current = self.current.clone();
        current.remove(object);
        current.len() >= MOVE_FROM && current.len() == current.capacity()
    }

    fn finish_moving(&mut self) {
        let previous = std::mem::take(&mut self.previous);
        if !previous.is_empty() {
            self.current.extend(previous);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_grows_by_moving_and_nothing_is_lost() {
        let mut map = LiveMap::default();
        // Records 0.. hold objects 8 * (i + 1); every third one removed.
        let mut records: Vec<ObjectAddress> = Vec::new();
        let mut moves = 0;
        for i in 0..100_000usize {
            if let Some(from) = map.moving_from() {
                moves += 1;
                let to = (from + MOVE_STEP).min(records.len());
                for &object in &records[from..to] {
                    map.move_entry(object);
                }
                map.moved_up_to(to, to == records.len());
            }
            let object = 8 * (i + 1);
            records.push(ObjectAddress(object));
            assert_eq!(map.insert(ObjectAddress(object), SampleId(i as u32)), None);
            if i % 3 == 2 {
                assert_eq!(
                    map.remove(&ObjectAddress(8 * i)),
                    Some(SampleId(i as u32 - 1))
                );
            }
        }
        assert!(moves > 0);
        assert_eq!(map.len(), 100_000 - 100_000 / 3);
        for i in 0..100_000usize {
            let expected = (i % 3 != 1).then_some(SampleId(i as u32));
            assert_eq!(
                map.get(&ObjectAddress(8 * (i + 1))).copied(),
                expected,
                "{i}"
            );
        }
        assert_eq!(map.keys().count(), map.len());
    }

    /// Fills `current` until the next insert of a new key would grow it.
    fn full_map() -> (LiveMap, u32) {
        let mut map = LiveMap::default();
        let mut i = 0u32;
        while !(map.current.len() >= MOVE_FROM && map.current.len() == map.current.capacity()) {
            map.insert(ObjectAddress(8 * (i as usize + 1)), SampleId(i));
            i += 1;
        }
        assert!(map.previous.is_empty());
        (map, i)
    }

    /// Found in review: the full table grew, and the old entry stayed
    /// behind in the previous one.
    #[test]
    fn an_address_mapped_again_in_a_full_table_keeps_one_entry() {
        let (mut map, n) = full_map();
        assert_eq!(
            map.insert(ObjectAddress(8), SampleId(999_999)),
            Some(SampleId(0))
        );
        assert_eq!(map.len(), n as usize);
        assert!(map.moving_from().is_none());
    }

    /// Found in review: the emptied table stayed allocated until the next
    /// growth.
    #[test]
    fn the_moved_out_table_is_let_go_once_empty() {
        let (mut map, n) = full_map();
        let mut records: Vec<ObjectAddress> = (0..n as usize)
            .map(|i| ObjectAddress(8 * (i + 1)))
            .collect();
        let mut i = n as usize;
        while map.moving_from().is_some() || i == n as usize {
            if let Some(from) = map.moving_from() {
                let to = (from + MOVE_STEP).min(records.len());
                for &object in &records[from..to] {
                    map.move_entry(object);
                }
                map.moved_up_to(to, to == records.len());
            }
            records.push(ObjectAddress(8 * (i + 1)));
            map.insert(ObjectAddress(8 * (i + 1)), SampleId(i as u32));
            i += 1;
        }
        assert_eq!(
            map.previous.capacity(),
            0,
            "the empty previous table is still allocated"
        );
        assert_eq!(map.len(), i);
    }

    #[test]
    fn an_address_mapped_again_while_moving_keeps_one_entry() {
        let mut map = LiveMap::default();
        let mut i = 0u32;
        while map.moving_from().is_none() {
            map.insert(ObjectAddress(8 * (i as usize + 1)), SampleId(i));
            i += 1;
        }
        // Object 8 is still in the previous table: mapped again, it moves.
        assert_eq!(
            map.insert(ObjectAddress(8), SampleId(999_999)),
            Some(SampleId(0))
        );
        assert_eq!(map.get(&ObjectAddress(8)), Some(&SampleId(999_999)));
        assert_eq!(map.len(), i as usize);
        assert_eq!(map.remove(&ObjectAddress(8)), Some(SampleId(999_999)));
        assert_eq!(map.get(&ObjectAddress(8)), None);
        map.moved_up_to(0, true);
        assert_eq!(map.moving_from(), None);
        assert_eq!(map.len(), i as usize - 1);
    }
}
