//! Unit tests of lazy liveness (liveness.rs), without a Ruby VM: object ids
//! are plain numbers, and "alive" is whatever the test says.

use super::*;
use crate::stack_table::Frame;
use crate::types::FrameRef;

fn lazy_state(max_heap: usize) -> SamplerState {
    let mut st = SamplerState::new(GapSampler::new(1.0, 1), 1_000, max_heap);
    st.set_lazy_liveness(true);
    st
}

/// Samples `object`, allocated after GC number `gc_count`.
fn sample(st: &mut SamplerState, object: ObjectAddress, gc_count: u32) -> SampleId {
    let admission = st.admission(1.0);
    let info = ObjectInfo {
        class: ClassRef(0),
        gc_count,
        ..ObjectInfo::default()
    };
    let frames = [Frame {
        frame: FrameRef(8),
        line: 1,
    }];
    st.record_allocation(object, info, &frames, admission)
        .expect("admitted")
}

/// What the postponed job does: ids (here 10x the address), then sizes.
fn settle(st: &mut SamplerState) {
    let ids: Vec<_> = st
        .pending_without_id()
        .into_iter()
        .map(|(id, object)| (id, object, object.0 as u64 * 10))
        .collect();
    st.assign_object_ids(&ids);
    st.measure_pending(|_| Some(40));
}

fn live_total(st: &mut SamplerState) -> f64 {
    let snapshot = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    snapshot.samples.iter().map(|s| s.values[2]).sum()
}

#[test]
fn pending_objects_get_ids_once_and_are_unpinned_when_measured() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    sample(&mut st, ObjectAddress(0x2000), 0);
    let pinned: Vec<_> = st.pending_objects().collect();
    assert_eq!(pinned, vec![ObjectAddress(0x1000), ObjectAddress(0x2000)]);
    assert_eq!(st.pending_without_id().len(), 2);
    settle(&mut st);
    assert_eq!(st.pending_objects().count(), 0);
    assert!(st.pending_without_id().is_empty());
    let ids: Vec<_> = st.live.values().map(|&id| st.object_id_of(id)).collect();
    assert!(ids.contains(&(0x1000 * 10)) && ids.contains(&(0x2000 * 10)));
}

#[test]
fn a_sample_taken_while_ids_are_asked_waits_for_its_own_id() {
    // Asking Ruby for ids can allocate, and a sample taken then is not in
    // the list the binding asked about: measured without an id, it could
    // never be found dead.
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    let asked = st.pending_without_id();
    sample(&mut st, ObjectAddress(0x2000), 0); // taken meanwhile
    let ids: Vec<_> = asked.iter().map(|&(id, object)| (id, object, 10)).collect();
    st.assign_object_ids(&ids);
    st.measure_pending(|_| Some(40));
    // Still pinned, and asked about by the next job.
    assert_eq!(
        st.pending_objects().collect::<Vec<_>>(),
        vec![ObjectAddress(0x2000)]
    );
    assert_eq!(st.pending_without_id().len(), 1);
    settle(&mut st);
    assert_eq!(st.pending_objects().count(), 0);
    // Both can now be found dead.
    st.forget_dead(1, |_, _| false);
    assert!(st.live.is_empty());
}

#[test]
fn pending_samples_left_unmarked_are_forgotten_unread_and_the_rest_kept() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    settle(&mut st);
    sample(&mut st, ObjectAddress(0x2000), 1);
    sample(&mut st, ObjectAddress(0x3000), 1);
    // Nothing is measured or asked for an id: the objects are not read.
    assert_eq!(st.forget_pending(), 2);
    assert_eq!(st.pending_objects().count(), 0);
    assert!(st.pending_without_id().is_empty());
    assert_eq!(
        st.live.keys().copied().collect::<Vec<_>>(),
        vec![ObjectAddress(0x1000)]
    );
    // The allocations stay in the allocation profile: they happened.
    assert_eq!(st.allocation_count(), 3);
    assert_eq!(live_total(&mut st), 1.0);
    // Later samples are pinned and settled as before.
    sample(&mut st, ObjectAddress(0x4000), 2);
    assert_eq!(
        st.pending_objects().collect::<Vec<_>>(),
        vec![ObjectAddress(0x4000)]
    );
    assert_eq!(st.forget_pending(), 1);
    assert_eq!(st.forget_pending(), 0);
}

#[test]
fn exact_mode_hands_out_no_ids_and_prunes_nothing() {
    let mut st = SamplerState::new(GapSampler::new(1.0, 1), 1_000, 100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    assert!(st.pending_without_id().is_empty());
    assert_eq!(st.forget_dead(0, |_, _| false), 0);
    assert!(!st.prune_due(0));
    assert_eq!(st.live_count(), 1);
}

#[test]
fn forget_dead_drops_only_what_is_gone_and_never_a_sample_without_id() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    sample(&mut st, ObjectAddress(0x2000), 0);
    settle(&mut st);
    sample(&mut st, ObjectAddress(0x3000), 0); // pending: no id yet, pinned, so alive
    let forgotten = st.forget_dead(1, |object, object_id| {
        assert_eq!(
            object_id,
            object.0 as u64 * 10,
            "asked with the sample's own id"
        );
        object != ObjectAddress(0x1000)
    });
    assert_eq!(forgotten, 1);
    assert_eq!(st.live_count(), 2);
    settle(&mut st);
    assert_eq!(live_total(&mut st), 2.0);
}

#[test]
fn a_new_sample_in_a_dead_samples_slot_replaces_it() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    settle(&mut st);
    // The object died unseen and its slot holds a new sampled object.
    sample(&mut st, ObjectAddress(0x1000), 1);
    settle(&mut st);
    assert_eq!(st.live_count(), 1);
    let id = *st.live.get(&ObjectAddress(0x1000)).expect("tracked");
    assert_eq!(st.object_id_of(id), 0x1000 * 10);
    assert_eq!(st.records[id.0 as usize].info().gc_count, 1);
}

#[test]
fn prunes_when_the_map_doubles_and_after_each_gc_once_nearly_full() {
    let mut st = lazy_state(8_000);
    for i in 0..1_023 {
        sample(&mut st, ObjectAddress(0x10_000 + i * 0x40), 0);
    }
    assert!(!st.prune_due(0));
    sample(&mut st, ObjectAddress(0x1_000_000), 0);
    assert!(st.prune_due(0), "1,024 tracked: the first prune");
    settle(&mut st);
    st.forget_dead(0, |_, _| true);
    assert!(!st.prune_due(0));
    // Next at twice as many (2,048), at least an eighth of the cap more.
    for i in 0..1_023 {
        sample(&mut st, ObjectAddress(0x2_000_000 + i * 0x40), 0);
    }
    assert!(!st.prune_due(0));
    sample(&mut st, ObjectAddress(0x3_000_000), 0);
    assert!(st.prune_due(0));
    settle(&mut st);
    st.forget_dead(0, |_, _| true);
    // Nearly full (7/8 of 8,000 = 7,000): once per GC, not per sample.
    for i in 0..5_000 {
        sample(&mut st, ObjectAddress(0x4_000_000 + i * 0x40), 0);
    }
    settle(&mut st);
    st.forget_dead(0, |_, _| true);
    assert!(st.live_count() >= 7_000);
    assert!(!st.prune_due(0), "pruned since GC 0");
    assert!(st.prune_due(1), "a GC ran since");
}

#[test]
fn a_small_live_set_is_not_thinned_when_pruned_before_the_cap() {
    let mut st = lazy_state(2_000);
    let mut gc = 0;
    for i in 0..100_000u64 {
        sample(&mut st, ObjectAddress(0x100_000 + (i as usize) * 0x40), gc);
        settle(&mut st);
        // A GC every 500 allocations, after which only every 100th lives.
        if i % 500 == 499 {
            gc += 1;
        }
        if st.prune_due(gc) {
            st.forget_dead(gc, |object, _| {
                let index = (object.0 - 0x100_000) / 0x40;
                index % 100 == 0 || index as u64 > i - (i % 500)
            });
        }
    }
    assert_eq!(st.drops().heap_bufsize, 0);
}

#[test]
fn compaction_keeps_addresses_that_are_safe_to_read_and_resolves_the_rest_by_id() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0); // old, not verified since: unresolved
    sample(&mut st, ObjectAddress(0x2000), 4); // taken since GC 4 began: safe to read
    settle(&mut st);
    sample(&mut st, ObjectAddress(0x3000), 4); // pending: pinned, never moves
    let mut read = Vec::new();
    st.forget_addresses(5, |object| {
        read.push(object);
        if object == ObjectAddress(0x2000) {
            ObjectAddress(0x2200)
        } else {
            object
        }
    });
    read.sort_unstable();
    assert_eq!(
        read,
        vec![ObjectAddress(0x2000), ObjectAddress(0x3000)],
        "the old sample's slot is never read"
    );
    assert_eq!(st.live_count(), 3);
    assert_eq!(st.unresolved(), vec![(st.unresolved()[0].0, 0x1000 * 10)]);
    assert!(st.live.contains_key(&ObjectAddress(0x2200)));
    // Found again by id, elsewhere.
    let (id, _) = st.unresolved()[0];
    st.resolve(&[(id, Some(ObjectAddress(0x1800)))]);
    assert!(st.unresolved().is_empty());
    assert!(st.live.contains_key(&ObjectAddress(0x1800)));
    settle(&mut st);
    assert_eq!(live_total(&mut st), 3.0);
}

#[test]
fn after_a_full_prune_since_the_last_gc_compaction_reads_every_address() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    settle(&mut st);
    st.forget_dead(4, |_, _| true);
    st.forget_addresses(5, |object| ObjectAddress(object.0 + 0x100));
    assert!(st.unresolved().is_empty());
    assert!(st.live.contains_key(&ObjectAddress(0x1100)));
}

#[test]
fn a_sample_not_found_by_id_is_gone_and_its_record_released() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    settle(&mut st);
    let records_before = st.free_records.len();
    st.forget_addresses(9, |object| object);
    let (id, _) = st.unresolved()[0];
    st.resolve(&[(id, None)]);
    assert_eq!(st.live_count(), 0);
    // The allocation list still holds it until the flush.
    let snapshot = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert_eq!(snapshot.heap_samples, 0);
    assert_eq!(st.free_records.len(), records_before + 1);
}

#[test]
fn a_flush_skips_samples_whose_address_is_unknown_and_measures_them_once_found() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    sample(&mut st, ObjectAddress(0x2000), 0);
    settle(&mut st);
    let measuring = st.begin_flush();
    st.forget_addresses(9, |object| object);
    let (first, _) = st.unresolved()[0];
    let (second, _) = st.unresolved()[1];
    st.resolve(&[(first, Some(ObjectAddress(0x5000)))]);
    let mut measured = Vec::new();
    st.forget_dead_in_flush(&measuring, usize::MAX, |_, _| true);
    while !st.measure_live(
        &measuring,
        InuseCutoff::at_flush(9),
        usize::MAX,
        &mut |object| {
            measured.push(object);
            Some(40)
        },
    ) {}
    assert_eq!(
        measured,
        vec![ObjectAddress(0x5000)],
        "the unresolved one is never touched"
    );
    let (snapshot, _naming) = st.end_snapshot(measuring, &mut |_| None);
    st.deliver_flush();
    assert_eq!(snapshot.heap_samples, 1);
    st.resolve(&[(second, Some(ObjectAddress(0x6000)))]);
    assert_eq!(st.live_count(), 2);
}

#[test]
fn forget_dead_in_flush_checks_only_the_next_chunk() {
    let mut st = lazy_state(100);
    for i in 0..10 {
        sample(&mut st, ObjectAddress(0x1000 + i * 0x40), 0);
    }
    settle(&mut st);
    let measuring = st.begin_flush();
    let mut asked = 0;
    st.forget_dead_in_flush(&measuring, 4, |_, _| {
        asked += 1;
        false
    });
    assert_eq!(asked, 4);
    assert_eq!(st.live_count(), 6);
    st.deliver_flush();
}

#[test]
fn clearing_releases_unresolved_samples() {
    let mut st = lazy_state(100);
    sample(&mut st, ObjectAddress(0x1000), 0);
    settle(&mut st);
    st.forget_addresses(9, |object| object);
    assert_eq!(st.live_count(), 1);
    st.clear();
    assert_eq!(st.live_count(), 0);
    assert!(st.unresolved().is_empty());
    assert_eq!(st.records.iter().filter(|r| r.refs > 0).count(), 0);
}

#[test]
fn samples_a_compaction_left_unresolved_count_against_the_cap() {
    let cap = 100;
    let mut st = lazy_state(cap);
    for i in 0..cap {
        sample(&mut st, ObjectAddress(0x1000 + i * 64), 0);
    }
    settle(&mut st);
    st.forget_addresses(5, |address| address);
    let unresolved = st.unresolved();
    assert_eq!(unresolved.len(), cap);
    // New samples while those are unknown must leave room for them.
    for i in 0..cap {
        sample(&mut st, ObjectAddress(0x10_0000 + i * 64), 5);
    }
    settle(&mut st);
    let found: Vec<_> = unresolved
        .iter()
        .map(|&(id, object_id)| (id, Some(ObjectAddress((object_id / 10) as usize))))
        .collect();
    st.resolve(&found);
    assert!(st.live_count() <= cap, "{} tracked", st.live_count());
}
