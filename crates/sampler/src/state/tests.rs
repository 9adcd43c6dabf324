//! The state's unit tests (no Ruby VM).

use super::admission::{Admission, THINNING_STEP};
use super::*;
use crate::stack_table::{Frame, FrameInfo};
use crate::types::{is_named_class, is_ruby_class, FrameRef};
use rand::RngExt;

/// One frame per id, each on line 1 (also for the other state test files).
pub(super) fn frames(ids: &[u64]) -> Vec<Frame> {
    ids.iter()
        .map(|&frame| Frame {
            frame: FrameRef(frame),
            line: 1,
        })
        .collect()
}

/// Offers a sample of `weight` and records it where it was admitted.
fn offer(st: &mut SamplerState, object: ObjectAddress, weight: f64, frame: u64) -> Admission {
    let admission = st.admission(weight);
    st.record_allocation(object, ObjectInfo::default(), &frames(&[frame]), admission);
    admission
}

/// In-use objects of samples sized over 500 bytes an object (the heavy
/// ones of the thinning tests), and of the rest.
fn heavy_and_light(snapshot: &FlushSnapshot) -> (f64, f64) {
    let (mut heavy, mut light) = (0.0, 0.0);
    for sample in &snapshot.samples {
        let [_, _, objects, space] = sample.values;
        if objects > 0.0 && space / objects > 500.0 {
            heavy += objects;
        } else {
            light += objects;
        }
    }
    (heavy, light)
}

fn state(max_alloc: usize, max_heap: usize) -> SamplerState {
    SamplerState::new(GapSampler::new(1.0, 1), max_alloc, max_heap)
}

fn record(state: &mut SamplerState, object: ObjectAddress, stack: &[u64]) -> Option<SampleId> {
    let admission = state.admission(1.0);
    state.record_allocation(object, ObjectInfo::default(), &frames(stack), admission)
}

/// Uniform draws alternating above and below 0.5: at retain rate 0.5,
/// exactly every other sample is kept.
fn alternating_draws() -> impl FnMut() -> f64 {
    let mut n = 0u32;
    move || {
        n += 1;
        if n % 2 == 0 {
            0.25
        } else {
            0.75
        }
    }
}

fn totals(snapshot: &FlushSnapshot) -> [f64; 4] {
    let mut sum = [0.0; 4];
    for sample in &snapshot.samples {
        for (s, v) in sum.iter_mut().zip(sample.values) {
            *s += v;
        }
    }
    sum
}

#[test]
fn live_objects_stay_until_freed_and_allocations_reset_each_flush() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8, 16]);
    record(&mut st, ObjectAddress(0x2000), &[8, 16]);
    st.measure_pending(|_| Some(40));

    let first = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert_eq!(totals(&first), [2.0, 80.0, 2.0, 80.0]);
    assert_eq!(first.allocation_samples, 2);
    assert_eq!(first.stacks.len(), 1);

    assert!(st.record_free(ObjectAddress(0x1000)));
    let second = st.take_snapshot(0, |_| Some(100));
    st.deliver_flush();
    assert_eq!(totals(&second), [0.0, 0.0, 1.0, 100.0]);

    assert!(st.record_free(ObjectAddress(0x2000)));
    let third = st.take_snapshot(0, |_| Some(100));
    st.deliver_flush();
    assert!(third.samples.is_empty());
    assert!(st.stacks().is_empty(), "unused stacks are pruned");
}

#[test]
fn live_samples_list_each_tracked_object_with_its_stack_weight_and_size() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8, 16]);
    record(&mut st, ObjectAddress(0x2000), &[9, 16]);
    st.measure_pending(|object| {
        Some(if object == ObjectAddress(0x1000) {
            40
        } else {
            72
        })
    });
    assert!(st.record_free(ObjectAddress(0x2000)));
    record(&mut st, ObjectAddress(0x3000), &[8, 16]);

    let mut live: Vec<_> = st.live_samples().collect();
    live.sort_by_key(|sample| sample.object.0);
    assert_eq!(live.len(), 2, "the freed one is not listed");
    assert_eq!(live[0].object, ObjectAddress(0x1000));
    assert_eq!((live[0].weight, live[0].size), (1.0, 40));
    assert_eq!(live[1].object, ObjectAddress(0x3000));
    assert_eq!(live[1].size, 0, "not measured yet");
    assert_eq!(live[0].stack, live[1].stack, "same frames, same stack");
    let frames = st.stacks().frames(live[0].stack);
    assert_eq!(
        frames.iter().map(|f| f.frame.0).collect::<Vec<_>>(),
        [8, 16]
    );
}

fn names(entries: &[(u64, &str)]) -> FastHashMap<FrameRef, FrameInfo> {
    entries
        .iter()
        .map(|&(frame, name)| {
            let info = FrameInfo {
                name: name.to_string(),
                filename: None,
                start_line: 0,
                blocks: None,
            };
            (FrameRef(frame), info)
        })
        .collect()
}

#[test]
fn named_frames_let_go_of_ruby_objects_and_samples_follow_merged_stacks() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8, 16]);
    st.measure_pending(|_| Some(40));
    let first = st.take_snapshot(0, |_| Some(40));
    st.detach_resolved_frames(&names(&[(8, "A#a"), (16, "<main>")]));
    st.deliver_flush();
    assert_eq!(st.stacks().frame_count(), 0);
    // The next interval: the same path, its method entry elsewhere.
    record(&mut st, ObjectAddress(0x2000), &[24, 16]);
    st.measure_pending(|_| Some(40));
    let second = st.take_snapshot(0, |_| Some(40));
    // Both samples are in the profile; the new one's names come from
    // the flush, the old one's from the table.
    assert_eq!(totals(&second), [1.0, 40.0, 2.0, 80.0]);
    assert_eq!(second.resolved_frames.len(), 2);
    st.detach_resolved_frames(&names(&[(24, "A#a"), (16, "<main>")]));
    st.deliver_flush();
    assert_eq!(st.stacks().len(), 1, "the two stacks merged");
    assert_eq!(st.stacks().frame_count(), 0);
    // Frees release the merged stack through both samples.
    assert!(st.record_free(ObjectAddress(0x1000)));
    assert!(st.record_free(ObjectAddress(0x2000)));
    let third = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert!(third.samples.is_empty());
    assert!(st.stacks().is_empty());
    assert_eq!(st.stacks().resolved_frame_count(), 0);
    assert_eq!(first.stacks.len(), 1);
}

#[test]
fn named_classes_replace_ruby_classes_and_go_with_their_samples() {
    let mut st = state(100, 100);
    let info = ObjectInfo {
        class: ClassRef(0x7000),
        ..ObjectInfo::default()
    };
    for object in [0x1000, 0x2000] {
        let admission = st.admission(1.0);
        st.record_allocation(ObjectAddress(object), info, &frames(&[8]), admission);
    }
    st.measure_pending(|_| Some(40));
    let _ = st.take_snapshot(0, |_| Some(40));
    assert_eq!(st.flush_classes(), [0x7000]);
    let names: FastHashMap<ClassRef, String> = [(ClassRef(0x7000), "Foo".to_string())]
        .into_iter()
        .collect();
    st.detach_resolved_classes(&names);
    st.deliver_flush();
    assert!(!st.held_classes().any(is_ruby_class), "no class kept alive");
    assert_eq!(st.named_class_count(), 1);

    // The next flush names them from the table.
    let second = st.take_snapshot(0, |_| Some(40));
    assert!(st.flush_classes().is_empty());
    assert_eq!(
        second.resolved_classes.values().collect::<Vec<_>>(),
        ["Foo"]
    );
    st.deliver_flush();

    assert!(st.record_free(ObjectAddress(0x1000)));
    let _ = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert_eq!(st.named_class_count(), 1);
    assert!(st.record_free(ObjectAddress(0x2000)));
    let _ = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert_eq!(
        st.named_class_count(),
        0,
        "the name goes with its last sample"
    );
}

#[test]
fn allocation_of_a_freed_object_still_counts_with_its_pending_size() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    st.measure_pending(|_| Some(5_000));
    st.record_free(ObjectAddress(0x1000));
    let snap = st.take_snapshot(0, |_| panic!("no live object to measure"));
    assert_eq!(totals(&snap), [1.0, 5_000.0, 0.0, 0.0]);
}

#[test]
fn caps_are_respected_and_drops_counted() {
    let mut st = state(3, 2);
    for i in 0..5 {
        record(&mut st, ObjectAddress(0x1000 + i * 40), &[8]);
    }
    assert_eq!(st.allocation_count(), 3);
    assert!(st.live_count() <= 2);
    let drops = st.drops();
    // 2 samples beyond the allocation cap (rejected or evicting another).
    assert_eq!(drops.allocation_bufsize, 2);
    // Every sample not tracked live, or thinned out of the live map.
    assert!(drops.heap_bufsize >= 3);

    let snap = st.take_snapshot(0, |_| Some(40));
    assert_eq!(snap.drops, drops);
    assert_eq!(st.drops(), DropCounters::default(), "flush resets drops");
    assert_eq!(snap.allocation_samples, 3);
    assert!(snap.heap_samples <= 2);
    // The 3 kept allocation samples stand for all 5.
    assert!((totals(&snap)[0] - 5.0).abs() < 1e-9);
}

#[test]
#[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
fn a_full_live_map_thins_but_still_estimates_the_whole_live_heap() {
    let mut errors = Vec::new();
    for seed in 0..20 {
        let mut st = SamplerState::new(GapSampler::new(1.0, seed), 1_000_000, 500);
        for i in 0..20_000usize {
            let admission = st.admission(1.0);
            st.record_allocation(
                ObjectAddress(0x1000 + i * 40),
                ObjectInfo::default(),
                &frames(&[8]),
                admission,
            );
            assert!(st.live_count() <= 500);
        }
        let snap = st.take_snapshot(0, |_| Some(40));
        let inuse = totals(&snap)[2];
        errors.push((inuse - 20_000.0) / 20_000.0);
    }
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    let worst = errors.iter().fold(0.0f64, |m, e| m.max(e.abs()));
    assert!(mean.abs() < 0.03, "mean error {mean}");
    assert!(worst < 0.25, "worst error {worst}");
}

#[test]
#[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
fn a_full_live_map_keeps_heavy_samples_whole_and_thins_light_ones() {
    // 50 window samples weighing 5,000 among 5,000 warm-up samples weighing
    // 100, all alive, in a map of 500: the heavy ones are all kept at their
    // weight, the light ones estimated without bias.
    const HEAVY: ObjectAddress = ObjectAddress(0x1000_0000);
    let mut light_errors = Vec::new();
    for seed in 0..20 {
        let mut st = SamplerState::new(GapSampler::new(1.0, seed), 1_000_000, 500);
        st.reseed(seed);
        for i in 0..5_050usize {
            let (object, weight) = if i % 101 == 100 {
                (ObjectAddress(HEAVY.0 + i * 40), 5_000.0)
            } else {
                (ObjectAddress(0x1000 + i * 40), 100.0)
            };
            let admission = st.admission(weight);
            st.record_allocation(object, ObjectInfo::default(), &frames(&[8]), admission);
            assert!(st.live_count() <= 500);
        }
        let snap = st.take_snapshot(0, |object| Some(if object >= HEAVY { 1_000 } else { 40 }));
        let (heavy, light) = heavy_and_light(&snap);
        assert_eq!(heavy, 50.0 * 5_000.0, "seed {seed}");
        light_errors.push(light / 500_000.0 - 1.0);
    }
    let mean = light_errors.iter().sum::<f64>() / light_errors.len() as f64;
    let worst = light_errors.iter().fold(0.0f64, |m, e| m.max(e.abs()));
    assert!(mean.abs() < 0.03, "mean error {mean}");
    assert!(worst < 0.15, "worst error {worst}");
}

#[test]
fn a_weight_beyond_f32_does_not_stop_live_tracking() {
    // 1e39 is a finite f64 but not an f32: the threshold it made was
    // infinite, and halving infinity never brought it back.
    let mut st = SamplerState::new(GapSampler::new(1.0, 1), 1_000, 100);
    let push = |st: &mut SamplerState, object: ObjectAddress, weight: f64| {
        let admission = st.admission(weight);
        st.record_allocation(object, ObjectInfo::default(), &frames(&[8]), admission);
        admission.live
    };
    for i in 0..99 {
        push(&mut st, ObjectAddress(0x1000 + i * 8), 10.0);
    }
    push(&mut st, ObjectAddress(0x10_0000), 1e39);
    push(&mut st, ObjectAddress(0x20_0000), 10.0);
    assert!(st.live_threshold.is_finite());
    st.record_free(ObjectAddress(0x10_0000));
    let tracked = (0..1_000)
        .filter(|i| push(&mut st, ObjectAddress(0x30_0000 + i * 8), 10.0))
        .count();
    assert!(tracked > 0);
    let snap = st.take_snapshot(0, |_| Some(40));
    assert!(totals(&snap).iter().all(|v| v.is_finite()));
}

#[test]
fn the_live_map_recovers_its_rate_once_objects_die() {
    let mut st = SamplerState::new(GapSampler::new(1.0, 1), 1_000_000, 100);
    for i in 0..1_000usize {
        let admission = st.admission(1.0);
        st.record_allocation(
            ObjectAddress(0x1000 + i * 40),
            ObjectInfo::default(),
            &frames(&[8]),
            admission,
        );
    }
    let objects: Vec<_> = st.live_objects().collect();
    for object in objects {
        st.record_free(object);
    }
    // Room again: the rate climbs back to 1 over the next samples.
    for i in 0..50usize {
        let admission = st.admission(1.0);
        st.record_allocation(
            ObjectAddress(0x9_0000 + i * 40),
            ObjectInfo::default(),
            &frames(&[8]),
            admission,
        );
    }
    assert!(st.live_count() >= 40, "tracked {}", st.live_count());
}

#[test]
#[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
fn a_full_allocation_list_keeps_a_uniform_sample_of_the_whole_interval() {
    // 1,000 early allocations from one stack, then 1,000 late ones from
    // another, through a list of 100: the late ones must not be lost.
    let mut late_share = Vec::new();
    for seed in 0..20 {
        let mut st = SamplerState::new(GapSampler::new(1.0, seed), 100, 0);
        for i in 0..2_000usize {
            let stack = if i < 1_000 { [8] } else { [16] };
            let admission = st.admission(1.0);
            st.record_allocation(
                ObjectAddress(0x1000 + i * 40),
                ObjectInfo::default(),
                &frames(&stack),
                admission,
            );
        }
        let snap = st.take_snapshot(0, |_| None);
        let late: f64 = snap
            .samples
            .iter()
            .filter(|s| snap.stacks[&s.stack][0].frame == 16)
            .map(|s| s.values[0])
            .sum();
        let total: f64 = snap.samples.iter().map(|s| s.values[0]).sum();
        assert!(
            (total - 2_000.0).abs() < 1e-6,
            "estimate of the total is exact"
        );
        late_share.push(late / total);
    }
    let mean = late_share.iter().sum::<f64>() / late_share.len() as f64;
    assert!((mean - 0.5).abs() < 0.05, "late allocations' share {mean}");
}

#[test]
fn thinned_samples_keep_their_reservoir_slot() {
    let mut st = state(10, 100);
    st.set_allocation_retain_rate(0.5);
    for i in 0..10 {
        record(&mut st, ObjectAddress(0x1000 + i * 40), &[8]);
    }
    st.measure_pending_with(&mut |_| Some(40), &mut alternating_draws());
    assert_eq!(st.allocation_count(), 5);
    // The list is still full: the next sample goes through the reservoir.
    let admission = st.admission(1.0);
    assert_ne!(admission.allocation, AllocationSlot::Append);
}

#[test]
fn reused_address_without_free_replaces_the_old_sample() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x1000), &[16]);
    assert_eq!(st.live_count(), 1);
    let snap = st.take_snapshot(0, |_| Some(40));
    let live: Vec<_> = snap.samples.iter().filter(|s| s.values[2] > 0.0).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(&*snap.stacks[&live[0].stack], &frames(&[16])[..]);
}

#[test]
fn objects_found_invalid_at_flush_count_as_freed() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[8]);
    let snap = st.take_snapshot(0, |addr| (addr == ObjectAddress(0x2000)).then_some(40));
    assert_eq!(snap.heap_samples, 1);
    assert_eq!(st.live_count(), 1);
}

#[test]
fn pending_sizes_skip_freed_records() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    st.record_free(ObjectAddress(0x1000));
    let mut measured = 0;
    st.measure_pending(|_| {
        measured += 1;
        Some(1)
    });
    assert_eq!(measured, 0);
    assert!(!st.has_pending_sizes());
}

#[test]
fn samples_outside_the_live_map_are_measured_while_their_free_is_watched() {
    let mut st = state(100, 0);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[8]);
    st.record_free(ObjectAddress(0x2000)); // freed before it was measured: never touched
    let mut measured = Vec::new();
    st.measure_pending(|address| {
        measured.push(address);
        Some(500)
    });
    assert_eq!(measured, vec![ObjectAddress(0x1000)]);
    // Once measured they are no longer watched (nor touched again).
    let snap = st.take_snapshot(0, |_| panic!("no live object to measure"));
    assert_eq!(totals(&snap), [2.0, 500.0, 0.0, 0.0]);
}

#[test]
fn thinned_out_samples_are_still_measured() {
    let mut st = SamplerState::new(GapSampler::new(1.0, 9), 1_000, 10);
    for i in 0..100 {
        record(&mut st, ObjectAddress(0x1000 + i * 40), &[8]);
    }
    let mut measured = 0;
    st.measure_pending(|_| {
        measured += 1;
        Some(40)
    });
    assert_eq!(measured, 100, "every sample is sized, tracked or not");
    let snap = st.take_snapshot(0, |_| Some(40));
    assert!((totals(&snap)[1] - 4_000.0).abs() < 1e-6);
}

#[test]
fn stop_tracking_live_forgets_addresses_but_keeps_allocations() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[8]);
    st.measure_pending(|_| Some(40));
    st.stop_tracking_live();
    assert_eq!(st.live_count(), 0);
    assert!(!st.record_free(ObjectAddress(0x1000)));
    let snap = st.take_snapshot(0, |_| panic!("nothing is tracked"));
    assert_eq!(totals(&snap), [2.0, 80.0, 0.0, 0.0]);
}

#[test]
fn relocation_moves_live_keys_and_pending_measurements() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[16]);
    // 0x1000 moves to 0x2000's old place and 0x2000 moves elsewhere.
    st.relocate_objects(|a| match a {
        ObjectAddress(0x1000) => ObjectAddress(0x2000),
        ObjectAddress(0x2000) => ObjectAddress(0x3000),
        other => other,
    });
    let mut keys: Vec<_> = st.live_objects().collect();
    keys.sort();
    assert_eq!(keys, vec![ObjectAddress(0x2000), ObjectAddress(0x3000)]);
    let mut measured = Vec::new();
    st.measure_pending(|a| {
        measured.push(a);
        Some(40)
    });
    measured.sort();
    assert_eq!(measured, vec![ObjectAddress(0x2000), ObjectAddress(0x3000)]);
    assert!(st.record_free(ObjectAddress(0x3000)));
    let snap = st.take_snapshot(0, |_| Some(40));
    let live: Vec<_> = snap.samples.iter().filter(|s| s.values[2] > 0.0).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(&snap.stacks[&live[0].stack][..], &frames(&[8])[..]);
}

#[test]
fn allocation_retain_rate_thins_the_allocation_list_and_reweights() {
    let mut st = state(1_000, 1_000);
    st.set_allocation_retain_rate(0.5);
    for i in 0..1_000 {
        record(&mut st, ObjectAddress(0x1000 + i * 40), &[8]);
    }
    // Alternating draws: exactly half are kept.
    st.measure_pending_with(&mut |_| Some(40), &mut alternating_draws());
    assert_eq!(st.allocation_count(), 500);
    assert_eq!(st.live_count(), 1_000, "live tracking is not thinned");
    let snap = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    let t = totals(&snap);
    assert_eq!(t[0], 1_000.0, "kept samples count double");
    assert_eq!(t[2], 1_000.0);
}

#[test]
fn stacks_are_not_pruned_while_a_flush_resolves_them() {
    let mut st = state(100, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    let snap = st.take_snapshot(0, |_| Some(40));
    assert!(st.flush_in_progress());
    st.clear(); // e.g. start! from another thread mid-flush
    assert_eq!(st.stacks().live_frames().collect::<Vec<_>>(), vec![8]);
    assert_eq!(snap.stacks.len(), 1);
    st.deliver_flush();
    assert!(st.stacks().is_empty());
}

#[test]
fn classes_of_a_flush_stay_held_until_it_finishes() {
    let mut st = state(100, 100);
    let info = ObjectInfo {
        class: ClassRef(0x5000),
        gc_count: 3,
        ..ObjectInfo::default()
    };
    let admission = st.admission(1.0);
    st.record_allocation(ObjectAddress(0x1000), info, &frames(&[8]), admission);
    st.record_free(ObjectAddress(0x1000));
    let snap = st.take_snapshot(7, |_| Some(40));
    assert_eq!(snap.samples[0].class, 0x5000);
    assert!(
        st.held_classes().any(|c| c == 0x5000),
        "held while flushing"
    );
    assert_eq!(st.flush_classes(), &[0x5000]);
    st.deliver_flush();
    assert!(!st.held_classes().any(|c| c == 0x5000));
}

#[test]
fn live_samples_carry_their_gc_age() {
    let mut st = state(100, 100);
    let admission = st.admission(1.0);
    let info = ObjectInfo {
        class: ClassRef(0x5000),
        gc_count: 3,
        ..ObjectInfo::default()
    };
    st.record_allocation(ObjectAddress(0x1000), info, &frames(&[8]), admission);
    let snap = st.take_snapshot(10, |_| Some(40));
    let ages: Vec<_> = snap.samples.iter().map(|s| s.gc_age).collect();
    assert_eq!(ages, vec![Some(7), None]);
}

/// Records one sample per GC count in `counts` (object 0x1000 + count x
/// 0x100), flushes with `cutoff`, and returns the GC counts of the samples
/// counted in use, and how many were left out.
fn inuse_under(counts: &[u32], cutoff: InuseCutoff) -> (Vec<u32>, usize) {
    let mut st = state(100, 100);
    for &count in counts {
        let admission = st.admission(1.0);
        let info = ObjectInfo {
            gc_count: count,
            ..ObjectInfo::default()
        };
        let object = 0x1000 + count as usize * 0x100;
        st.record_allocation(ObjectAddress(object), info, &frames(&[8]), admission);
    }
    let measuring = st.begin_flush();
    let mut measured = Vec::new();
    while !st.measure_live(&measuring, cutoff, 2, &mut |object| {
        measured.push(((object.0 - 0x1000) / 0x100) as u32);
        Some(40)
    }) {}
    let (snap, _) = st.end_snapshot(measuring, &mut |_| Some(40));
    let inuse: f64 = snap.samples.iter().map(|s| s.values[2]).sum();
    assert_eq!(
        inuse as usize,
        measured.len(),
        "each counted sample measured once"
    );
    // Every allocation is in alloc_*, whatever its age.
    let allocated: f64 = snap.samples.iter().map(|s| s.values[0]).sum();
    assert_eq!(allocated as usize, counts.len());
    (measured, snap.too_young)
}

#[test]
fn in_use_counts_what_lived_through_the_last_completed_gc() {
    let counts = [3, 8, 9, 10];
    // GC 10 done: objects allocated before it started (count 9 and less).
    assert_eq!(
        inuse_under(&counts, InuseCutoff::last_completed_gc(10, false)),
        (vec![3, 8, 9], 1)
    );
    // GC 10 marking or sweeping: the last completed one is GC 9.
    assert_eq!(
        inuse_under(&counts, InuseCutoff::last_completed_gc(10, true)),
        (vec![3, 8], 2)
    );
    // At the flush: everything still tracked.
    assert_eq!(
        inuse_under(&counts, InuseCutoff::at_flush(10)),
        (vec![3, 8, 9, 10], 0)
    );
}

#[test]
fn a_sample_left_out_as_too_young_counts_at_a_later_flush() {
    let mut st = state(100, 100);
    let admission = st.admission(1.0);
    let info = ObjectInfo {
        gc_count: u32::MAX,
        ..ObjectInfo::default()
    };
    st.record_allocation(ObjectAddress(0x1000), info, &frames(&[8]), admission);
    let cutoff = InuseCutoff::last_completed_gc(u32::MAX, false);
    let first = st.take_snapshot_with(cutoff, |_| Some(40));
    assert_eq!((totals(&first)[2], first.too_young), (0.0, 1));
    st.deliver_flush();
    // The GC count wraps: one GC later it is 0.
    let second = st.take_snapshot_with(InuseCutoff::last_completed_gc(0, false), |_| Some(40));
    assert_eq!((totals(&second)[2], second.too_young), (1.0, 0));
    assert_eq!(second.samples[0].gc_age, Some(1));
}

#[test]
fn weights_scale_values() {
    let mut st = SamplerState::new(GapSampler::new(0.5, 1), 10, 10);
    let admission = st.admission(100.0);
    st.record_allocation(
        ObjectAddress(0x1000),
        ObjectInfo::default(),
        &frames(&[8]),
        admission,
    );
    let snap = st.take_snapshot(0, |_| Some(40));
    assert_eq!(totals(&snap), [100.0, 4_000.0, 100.0, 4_000.0]);
}

#[test]
fn clear_forgets_everything() {
    let mut st = state(1, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[8]);
    st.clear();
    assert_eq!(st.live_count(), 0);
    assert_eq!(st.allocation_count(), 0);
    assert_eq!(st.drops(), DropCounters::default());
    assert!(st.stacks().is_empty());
    assert!(st.memory_bytes() > 0);
}

#[test]
fn the_free_filter_never_hides_a_tracked_address() {
    let mut st = SamplerState::new(GapSampler::new(1.0, 3), 50, 300);
    let mut rng = SmallRng::seed_from_u64(5);
    let filter = st.free_filter();
    for round in 0..test_support::miri_scaled(20_000) as u64 {
        let object = 0x10_0000 + (rng.random::<u64>() % 2_000) as usize * 40;
        match rng.random::<u32>() % 10 {
            0..=4 => {
                record(&mut st, ObjectAddress(object), &[round % 7]);
            }
            5..=7 => {
                st.record_free(ObjectAddress(object));
            }
            8 => st.measure_pending(|_| Some(40)),
            _ => {
                if round % 1_000 == 9 {
                    st.relocate_objects(|a| {
                        if a.0 % 80 == 0 {
                            ObjectAddress(a.0 + 8)
                        } else {
                            a
                        }
                    });
                } else if round % 5_000 == 19 {
                    st.clear();
                } else {
                    let snapshot = st.take_snapshot(0, |_| Some(40));
                    drop(snapshot);
                    st.deliver_flush();
                }
            }
        }
        let tracked: Vec<ObjectAddress> =
            st.live.keys().chain(st.watched.keys()).copied().collect();
        assert!(
            tracked.iter().all(|&a| filter.may_contain(a)),
            "round {round}: a tracked address is missing from the filter"
        );
    }
    // Stale bits do not pile up: rebuilds keep the filter close to the
    // tracked set.
    let set_bits = (0..4_000usize)
        .map(|i| 0x10_0000 + i * 40)
        .filter(|&a| filter.may_contain(ObjectAddress(a)))
        .count();
    assert!(
        set_bits <= 2 * (st.live.len() + st.watched.len()) + 1_200,
        "{set_bits}"
    );
}

#[test]
fn a_sample_freed_before_its_measurement_is_sized_at_free() {
    let mut st = state(10, 10);
    record(&mut st, ObjectAddress(0x1000), &[1]);
    record(&mut st, ObjectAddress(0x2000), &[1]);
    assert_eq!(st.pending_count(), 2);
    assert!(st.record_free_measuring(ObjectAddress(0x1000), |_| Some(123)));
    // Without a size at free (a type not measurable there): stays 0.
    assert!(st.record_free_measuring(ObjectAddress(0x2000), |_| None));
    st.measure_pending(|_| panic!("both were freed"));
    let snapshot = st.take_snapshot(0, |_| None);
    let mut spaces: Vec<f64> = snapshot.samples.iter().map(|s| s.values[1]).collect();
    spaces.sort_by(f64::total_cmp);
    assert_eq!(spaces, vec![0.0, 123.0]);
}

#[test]
fn classes_of_live_samples_stay_held_while_a_flush_walks() {
    let mut st = state(0, 10);
    let admission = st.admission(1.0);
    let info = ObjectInfo {
        class: ClassRef(0x5550),
        ..ObjectInfo::default()
    };
    st.record_allocation(ObjectAddress(0x1000), info, &frames(&[1]), admission);
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    assert!(st.measure_live(&measuring, InuseCutoff::at_flush(0), 10, &mut |_| Some(40)));
    // The object dies before the flush names its class.
    st.record_free(ObjectAddress(0x1000));
    assert!(st.held_classes().any(|c| c == 0x5550));
    let (snapshot, _naming) = st.end_snapshot(measuring, &mut |_| Some(40));
    assert_eq!(snapshot.heap_samples, 1);
    st.deliver_flush();
    assert!(!st.held_classes().any(|c| c == 0x5550));
}

#[test]
fn a_watched_address_never_points_at_a_reused_record() {
    // Nothing enters the allocation list; the live map holds 4, so
    // thinning moves unmeasured samples to the watched map.
    let mut st = state(0, 4);
    for i in 0..5 {
        record(&mut st, ObjectAddress(0x1000 + i * 0x100), &[i as u64]);
    }
    let watched: Vec<ObjectAddress> = st.watched.keys().copied().collect();
    for &object in &watched {
        st.record_free(object);
    }
    let live = st.live_count();
    let snapshot = st.take_snapshot(0, |_| Some(40));
    assert_eq!(snapshot.heap_samples, live);
}

#[test]
fn a_sample_record_fits_in_48_bytes() {
    // Most of the collector's memory per live sample (see memory_bytes).
    assert!(std::mem::size_of::<SampleRecord>() <= 48);
}

#[test]
fn a_record_keeps_its_liveness_marks_and_labels() {
    for liveness in [
        Liveness::Live,
        Liveness::Freed,
        Liveness::Watched,
        Liveness::Untracked,
    ] {
        for taken in [false, true] {
            let mut marks = Marks::new(liveness, taken);
            assert_eq!((marks.liveness(), marks.taken_in_walk()), (liveness, taken));
            assert!(!marks.alloc_dropped());
            marks.set(Marks::ALLOC_DROPPED, true);
            marks.set_liveness(Liveness::Freed);
            assert_eq!(marks.liveness(), Liveness::Freed);
            assert!(marks.alloc_dropped());
            assert_eq!(marks.taken_in_walk(), taken);
        }
    }
    let mut st = state(10, 10);
    let admission = st.admission(1.0);
    let mut info = ObjectInfo::new(ClassRef(8), 3);
    info.labels = LabelSetId(49_999);
    let id = st
        .record_allocation(ObjectAddress(0x1000), info, &frames(&[1]), admission)
        .expect("recorded");
    assert_eq!(st.records[id.index()].info(), info);
}

#[test]
fn a_flush_measured_in_chunks_sees_what_was_live_when_it_began() {
    let mut st = state(100, 100);
    for i in 0..10 {
        record(&mut st, ObjectAddress(0x1000 + i * 0x100), &[i as u64]);
    }
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    let mut measure = |_| Some(40);
    assert!(!st.measure_live(&measuring, InuseCutoff::at_flush(0), 4, &mut measure));
    // Between chunks: one object freed, one new allocation, and a
    // compaction that moves every object.
    st.record_free(ObjectAddress(0x1000 + 9 * 0x100));
    record(&mut st, ObjectAddress(0x9000), &[99]);
    st.relocate_objects(|a| ObjectAddress(a.0 + 8));
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 4, &mut measure) {}
    let (snapshot, _naming) = st.end_snapshot(measuring, &mut measure);
    st.deliver_flush();
    // 10 allocations of the interval; 9 or 10 live (the freed one may
    // have been measured before it died); the new one is not in it.
    assert_eq!(snapshot.allocation_samples, 10);
    assert!((9..=10).contains(&snapshot.heap_samples));
    assert_eq!(st.allocation_count(), 1);
    let next = st.take_snapshot(0, |_| Some(40));
    assert_eq!(next.allocation_samples, 1);
    assert_eq!(next.heap_samples, 10);
}

/// Live samples are found by walking the records a chunk at a time (no
/// copy of the live map in one hold): a sample freed before its turn is
/// not measured, and one taken meanwhile in a freed record's slot is not
/// either (it is the next flush's, and may not be measured or given its
/// id yet: found in review).
#[test]
fn a_flush_measured_in_chunks_measures_the_samples_taken_before_it_began() {
    let mut st = state(100, 100);
    for i in 0..10 {
        record(&mut st, ObjectAddress(0x1000 + i * 0x100), &[i as u64]);
    }
    st.measure_pending(|_| Some(40));
    drop(st.take_snapshot(0, |_| Some(40)));
    st.deliver_flush();
    let measuring = st.begin_flush();
    let mut measure = |_| Some(40);
    assert!(!st.measure_live(&measuring, InuseCutoff::at_flush(0), 4, &mut measure));
    st.record_free(ObjectAddress(0x1000 + 2 * 0x100)); // measured already
    st.record_free(ObjectAddress(0x1000 + 7 * 0x100)); // not yet: its slot is free
    let new = record(&mut st, ObjectAddress(0x9000), &[99]).unwrap();
    assert_eq!(new, SampleId(7), "the freed record's slot, not yet walked");
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 4, &mut measure) {}
    let (snapshot, _naming) = st.end_snapshot(measuring, &mut measure);
    st.deliver_flush();
    assert_eq!(snapshot.heap_samples, 9);
    assert_eq!(
        snapshot.allocation_samples, 0,
        "taken after the flush began"
    );
    let stacks: Vec<u64> = snapshot.samples[..snapshot.heap_samples]
        .iter()
        .map(|s| snapshot.stacks[&s.stack][0].frame.0)
        .collect();
    assert!(stacks.contains(&2) && !stacks.contains(&7) && !stacks.contains(&99));
    st.measure_pending(|_| Some(40));
    let next = st.take_snapshot(0, |_| Some(40));
    assert_eq!((next.heap_samples, next.allocation_samples), (9, 1));
    let stacks: Vec<u64> = next.samples[..next.heap_samples]
        .iter()
        .map(|s| next.stacks[&s.stack][0].frame.0)
        .collect();
    assert!(stacks.contains(&99), "the next flush's");
}

#[test]
fn a_forked_child_keeps_live_samples_but_not_the_parents_allocations() {
    let mut st = SamplerState::new(GapSampler::new(0.5, 9), 1, 100);
    record(&mut st, ObjectAddress(0x1000), &[8]);
    record(&mut st, ObjectAddress(0x2000), &[9]); // the list is full: counted as seen
    let seed_before = st.gaps.seed();
    st.start_child_interval(4242);
    assert_ne!(st.gaps.seed(), seed_before);
    assert_eq!(st.allocation_count(), 0);
    let snapshot = st.take_snapshot(0, |_| Some(40));
    assert_eq!(snapshot.allocation_samples, 0);
    assert_eq!(snapshot.heap_samples, 2);
    assert!(snapshot.samples.iter().all(|s| s.values[0] == 0.0));
    st.deliver_flush();
    // Both stacks are still held by the live samples.
    assert!(!st.stacks().is_empty());
    assert!(st.record_free(ObjectAddress(0x1000)));
}

#[test]
fn the_child_seed_depends_only_on_the_parent_seed_and_the_pid() {
    let child = |pid| {
        let mut st = SamplerState::new(GapSampler::new(0.5, 9), 10, 10);
        st.start_child_interval(pid);
        st.gaps.seed()
    };
    assert_eq!(child(7), child(7));
    assert_ne!(child(7), child(8));
}

fn rec_class(st: &mut SamplerState, object: ObjectAddress, class: ClassRef, stack: &[u64]) {
    let admission = st.admission(1.0);
    let info = ObjectInfo {
        class,
        ..ObjectInfo::default()
    };
    st.record_allocation(object, info, &frames(stack), admission);
}

/// An allocation sample taken during flush K (after end_snapshot, before
/// step 4) gets the named handle at step 4; when its object dies and the
/// allocation list holds the last holder, end_snapshot of flush K+1
/// releases the record before looking the name up: the name is lost.
#[test]
fn named_class_of_an_allocation_sample_outlives_its_last_record() {
    let mut st = state(100, 100);
    rec_class(&mut st, ObjectAddress(0x1000), ClassRef(0x7000), &[8]);
    st.measure_pending(|_| Some(40));
    let _ = st.take_snapshot(0, |_| Some(40));
    // Another thread samples an object of the same class mid-flush.
    rec_class(&mut st, ObjectAddress(0x2000), ClassRef(0x7000), &[8]);
    let names: FastHashMap<ClassRef, String> = [(ClassRef(0x7000), "Foo".to_string())]
        .into_iter()
        .collect();
    st.detach_resolved_classes(&names);
    st.deliver_flush();
    st.measure_pending(|_| Some(40));
    assert!(st.record_free(ObjectAddress(0x1000)));
    assert!(st.record_free(ObjectAddress(0x2000)));
    let snap = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert_eq!(snap.allocation_samples, 1);
    let class = snap.samples[0].class;
    assert!(is_named_class(class));
    assert_eq!(
        snap.resolved_classes.get(&class).map(String::as_str),
        Some("Foo"),
        "class name of the allocation sample lost"
    );
}

/// Live path: measured in a chunk, then the object dies (another thread
/// ran between chunks) before end_snapshot.
#[test]
fn named_class_of_a_live_sample_freed_mid_flush_keeps_its_name() {
    let mut st = state(100, 100);
    rec_class(&mut st, ObjectAddress(0x1000), ClassRef(0x7000), &[8]);
    st.measure_pending(|_| Some(40));
    let _ = st.take_snapshot(0, |_| Some(40));
    let names: FastHashMap<ClassRef, String> = [(ClassRef(0x7000), "Foo".to_string())]
        .into_iter()
        .collect();
    st.detach_resolved_classes(&names);
    st.deliver_flush();
    let measuring = st.begin_flush();
    let mut m = |_: ObjectAddress| Some(40u64);
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 1, &mut m) {}
    assert!(st.record_free(ObjectAddress(0x1000))); // freed while the flush yielded
    let (snap, _naming) = st.end_snapshot(measuring, &mut m);
    st.deliver_flush();
    assert_eq!(snap.heap_samples, 1);
    let class = snap.samples[0].class;
    assert_eq!(
        snap.resolved_classes.get(&class).map(String::as_str),
        Some("Foo"),
        "class name of the live sample lost"
    );
}

/// Timing, not a check: `cargo test --release -p memprofiler_pprof_sampler --lib detach_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a timing to read, not a check"]
fn detach_cost_on_a_large_heap() {
    use rand::RngExt;
    let mut rng = SmallRng::seed_from_u64(7);
    let paths: Vec<Vec<Frame>> = (0..4000)
        .map(|_| {
            let depth = rng.random_range(1..=100usize);
            (0..depth)
                .map(|_| {
                    // A method appears at one of its few call sites.
                    let method = rng.random_range(0..3000u64);
                    Frame {
                        frame: FrameRef(0x10000 + method * 0x40),
                        line: (method % 400) as i32 + rng.random_range(0..3),
                    }
                })
                .collect()
        })
        .collect();
    let mut st = state(1_000_000, 1_000_000);
    for i in 0..50_000usize {
        let p = &paths[rng.random_range(0..paths.len())];
        let admission = st.admission(1.0);
        let info = ObjectInfo {
            class: ClassRef(0x100000 + (i as u64 % 2000) * 0x28),
            ..ObjectInfo::default()
        };
        st.record_allocation(ObjectAddress(0x1000_0000 + i * 40), info, p, admission);
    }
    st.measure_pending(|_| Some(40));
    let t = std::time::Instant::now();
    let snap = st.take_snapshot(0, |_| Some(40));
    eprintln!(
        "take_snapshot (first) {:?}, stacks {}",
        t.elapsed(),
        snap.stacks.len()
    );
    let names: FastHashMap<FrameRef, FrameInfo> = (0..3000u64)
        .map(|m| {
            (
                FrameRef(0x10000 + m * 0x40),
                FrameInfo {
                    name: format!("BenchWorkloads::Scenario::Calls.method_{m}"),
                    filename: Some("/work/main/bench/lib/workloads.rb".to_string()),
                    start_line: m as i64,
                    blocks: None,
                },
            )
        })
        .collect();
    let classes: FastHashMap<ClassRef, String> = (0..2000u64)
        .map(|c| {
            (
                ClassRef(0x100000 + c * 0x28),
                format!("BenchWorkloads::Scenario::Class{c}"),
            )
        })
        .collect();
    let t = std::time::Instant::now();
    st.detach_resolved_frames(&names);
    eprintln!("detach_resolved_frames {:?}", t.elapsed());
    let t = std::time::Instant::now();
    st.detach_resolved_classes(&classes);
    eprintln!("detach_resolved_classes {:?}", t.elapsed());
    let t = std::time::Instant::now();
    st.deliver_flush();
    eprintln!("finish_flush {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let snap = st.take_snapshot(0, |_| Some(40));
    eprintln!(
        "take_snapshot (second) {:?} resolved {}",
        t.elapsed(),
        snap.resolved_frames.len()
    );
    st.detach_resolved_frames(&FastHashMap::default());
    st.deliver_flush();
    // Steady state: one interval's 10,000 new samples over the same paths.
    for i in 0..10_000usize {
        let p = &paths[rng.random_range(0..paths.len())];
        let admission = st.admission(1.0);
        let info = ObjectInfo {
            class: ClassRef(0x100000 + (i as u64 % 2000) * 0x28),
            ..ObjectInfo::default()
        };
        st.record_allocation(ObjectAddress(0x2000_0000 + i * 40), info, p, admission);
    }
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    let mut m = |_: ObjectAddress| Some(40u64);
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), usize::MAX, &mut m) {}
    let t = std::time::Instant::now();
    let (snap, _naming) = st.end_snapshot(measuring, &mut m);
    eprintln!(
        "end_snapshot (steady) {:?} stacks {} resolved {}",
        t.elapsed(),
        snap.stacks.len(),
        snap.resolved_frames.len()
    );
    let t = std::time::Instant::now();
    st.detach_resolved_frames(&names);
    eprintln!(
        "detach_resolved_frames (steady, 10k new samples) {:?}, stacks now {}",
        t.elapsed(),
        st.stacks().len()
    );
    st.deliver_flush();
}

/// Random interleavings of samples, frees, flushes (with frames sampled
/// "during" the flush left unnamed), detaches and prunes: every live
/// sample keeps its original names, refcounts stay consistent.
/// For the fuzz test: samples a new object with `stack`; if it is
/// tracked live, remembers the frame names its profile must show.
fn sample_expecting(
    st: &mut SamplerState,
    next_obj: &mut ObjectAddress,
    expected: &mut FastHashMap<ObjectAddress, Vec<(String, i32)>>,
    stack: &[Frame],
    name: impl Fn(u64) -> String,
) {
    let admission = st.admission(1.0);
    let obj = *next_obj;
    next_obj.0 += 40;
    if st
        .record_allocation(obj, ObjectInfo::default(), stack, admission)
        .is_some()
        && admission.live
    {
        expected.insert(
            obj,
            stack.iter().map(|f| (name(f.frame.0), f.line)).collect(),
        );
    }
}

#[test]
#[cfg_attr(miri, ignore = "200 random runs; too slow under Miri")]
fn random_flushes_and_detaches_keep_names_and_refcounts() {
    use rand::RngExt;
    for seed in 0..200u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut st = state(1_000, 1_000);
        // Ruby frame value -> name; values get "reused" for other names
        // only once no stack holds them (like a freed iseq).
        let name_of = |v: u64, gen: &FastHashMap<u64, u32>| {
            format!("m{}g{}", v, gen.get(&v).copied().unwrap_or(0))
        };
        let mut gen: FastHashMap<u64, u32> = FastHashMap::default();
        let mut expected: FastHashMap<ObjectAddress, Vec<(String, i32)>> = FastHashMap::default();
        let mut next_obj = ObjectAddress(0x1000);
        for _round in 0..30 {
            for _ in 0..rng.random_range(0..20) {
                let depth = rng.random_range(0..5usize);
                let stack: Vec<Frame> = (0..depth)
                    .map(|_| Frame {
                        frame: FrameRef(8 * rng.random_range(1..6u64)),
                        line: rng.random_range(1..3),
                    })
                    .collect();
                sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                    name_of(f, &gen)
                });
            }
            st.measure_pending(|_| Some(8));
            let objs: Vec<_> = expected.keys().copied().collect();
            for o in objs {
                if rng.random_bool(0.3) {
                    st.record_free(o);
                    expected.remove(&o);
                }
            }
            let measuring = st.begin_flush();
            while !st.measure_live(
                &measuring,
                InuseCutoff::at_flush(0),
                usize::MAX,
                &mut |_| Some(8),
            ) {}
            while !st.read_allocations(&measuring, 3, &mut |_| Some(8)) {}
            let (mut snap, naming) = st.end_snapshot_samples(measuring, &mut |_| Some(8));
            while !st.copy_stacks(&naming, &mut snap, 2) {}
            // Check every live sample's names.
            let mut got: Vec<Vec<(String, i32)>> = snap
                .samples
                .iter()
                .filter(|s| s.gc_age.is_some())
                .map(|s| {
                    snap.stacks[&s.stack]
                        .iter()
                        .map(|f| {
                            let n = match snap.resolved_frames.get(&f.frame) {
                                Some(info) => info.name.clone(),
                                None => {
                                    assert!(!is_resolved_frame_(f.frame.0));
                                    name_of(f.frame.0, &gen)
                                }
                            };
                            (n, f.line)
                        })
                        .collect()
                })
                .collect();
            let mut want: Vec<Vec<(String, i32)>> = expected.values().cloned().collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "seed {seed}");
            // Names of the snapshot's Ruby frames, as resolve_frames would.
            let mut names: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
            for frames in snap.stacks.values() {
                for f in frames.iter() {
                    if !is_resolved_frame_(f.frame.0) {
                        names.insert(
                            f.frame,
                            FrameInfo {
                                name: name_of(f.frame.0, &gen),
                                filename: None,
                                start_line: 0,
                                blocks: None,
                            },
                        );
                    }
                }
            }
            // Samples taken while the flush ran (not named).
            for _ in 0..rng.random_range(0..4) {
                let stack: Vec<Frame> = (0..rng.random_range(1..4usize))
                    .map(|_| Frame {
                        frame: FrameRef(8 * rng.random_range(1..8u64)),
                        line: 1,
                    })
                    .collect();
                sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                    name_of(f, &gen)
                });
            }
            if rng.random_bool(0.8) {
                // In batches, other threads sampling in between, and
                // frame values no stack holds any more being reused
                // for other code meanwhile.
                let detaching = st.begin_detach(naming, &FastHashMap::default());
                while !st.detach_frames_batch(&detaching, &names, rng.random_range(1..4)) {
                    for _ in 0..rng.random_range(0..3) {
                        let stack: Vec<Frame> = (0..rng.random_range(1..4usize))
                            .map(|_| Frame {
                                frame: FrameRef(8 * rng.random_range(1..8u64)),
                                line: 1,
                            })
                            .collect();
                        sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                            name_of(f, &gen)
                        });
                    }
                    // review36: frees between batches too.
                    let objs: Vec<_> = expected.keys().copied().collect();
                    for o in objs {
                        if rng.random_bool(0.1) {
                            st.record_free(o);
                            expected.remove(&o);
                        }
                    }
                    let live: std::collections::HashSet<u64> =
                        st.stacks().live_frames().map(|f| f.0).collect();
                    for v in 1..8u64 {
                        if !live.contains(&(8 * v)) && rng.random_bool(0.3) {
                            *gen.entry(8 * v).or_insert(0) += 1;
                        }
                    }
                }
            }
            st.deliver_flush();
            // Frame values no stack holds may be reused for other code.
            let live: std::collections::HashSet<u64> =
                st.stacks().live_frames().map(|f| f.0).collect();
            for v in 1..8u64 {
                if !live.contains(&(8 * v)) && rng.random_bool(0.5) {
                    *gen.entry(8 * v).or_insert(0) += 1;
                }
            }
        }
        for o in expected.keys().copied().collect::<Vec<_>>() {
            st.record_free(o);
        }
        let _ = st.take_snapshot(0, |_| Some(8));
        st.deliver_flush();
        assert!(st.stacks().is_empty(), "seed {seed}");
        assert_eq!(st.stacks().resolved_frame_count(), 0, "seed {seed}");
        assert_eq!(st.stacks().frame_count(), 0, "seed {seed}");
    }
}
fn is_resolved_frame_(f: u64) -> bool {
    crate::types::is_resolved_frame(FrameRef(f))
}

/// A flush reads the allocation list and copies stacks in chunks, letting
/// other threads run between them: the profile is the one read at once,
/// and stacks that fall unused meanwhile stay until the flush ends.
#[test]
fn a_flush_read_in_chunks_is_the_flush_read_at_once() {
    let fill = |st: &mut SamplerState| {
        for i in 0..50usize {
            let stack = [8 * (i as u64 % 7 + 1), 8 * (i as u64 + 100)];
            record(st, ObjectAddress(0x1000 + i * 0x40), &stack);
        }
        st.measure_pending(|_| Some(40));
        // Half die before the flush: their stacks go at once.
        for i in (0..50usize).step_by(2) {
            st.record_free(ObjectAddress(0x1000 + i * 0x40));
        }
    };
    let mut whole = state(100, 100);
    fill(&mut whole);
    let expected = whole.take_snapshot(0, |_| Some(40));

    let mut st = state(100, 100);
    fill(&mut st);
    let measuring = st.begin_flush();
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 3, &mut |_| Some(40)) {}
    let mut reads = 0;
    while !st.read_allocations(&measuring, 7, &mut |_| Some(40)) {
        reads += 1;
        // Another thread frees objects between chunks: their stacks wait.
        st.record_free(ObjectAddress(0x1000 + (2 * reads + 1) * 0x40));
    }
    assert!(reads >= 7, "{reads}");
    let stacks_while_held = st.stacks().len();
    let (mut snapshot, naming) = st.end_snapshot_samples(measuring, &mut |_| Some(40));
    let mut copies = 0;
    while !st.copy_stacks(&naming, &mut snapshot, 5) {
        copies += 1;
    }
    assert!(copies >= 9, "{copies}");
    assert_eq!(snapshot.heap_samples, expected.heap_samples);
    assert_eq!(snapshot.allocation_samples, expected.allocation_samples);
    assert_eq!(totals(&snapshot), totals(&expected));
    assert_eq!(snapshot.stacks.len(), expected.stacks.len());
    for sample in &snapshot.samples {
        assert!(snapshot.stacks.contains_key(&sample.stack));
    }
    assert_eq!(st.stacks().len(), stacks_while_held, "held until the end");
    st.deliver_flush();
    assert!(st.stacks().len() < stacks_while_held);
    // What is left: the stacks of the samples still alive.
    assert_eq!(st.stacks().len(), st.live_count());
}

/// 20 samples (objects 0x10000 on), and `extra` more (0x40000 on), of 20
/// stacks that all read `Leaf#a < Mid#b < <main>` once named: a flush
/// names them, merging them into one stack.
fn name_the_path(st: &mut SamplerState, extra: u64) {
    let path = |i: u64| [8 * (i + 1000), 8 * (i + 1100), 16];
    let mut named = Vec::new();
    for i in 0..20u64 {
        record(st, ObjectAddress(0x10000 + i as usize * 0x40), &path(i));
        named.push((8 * (i + 1000), "Leaf#a"));
        named.push((8 * (i + 1100), "Mid#b"));
    }
    for j in 0..extra {
        record(
            st,
            ObjectAddress(0x40000 + j as usize * 0x40),
            &path(j % 20),
        );
    }
    named.push((16, "<main>"));
    st.measure_pending(|_| Some(40));
    st.take_snapshot(0, |_| Some(40));
    st.detach_resolved_frames(&names(&named));
    st.deliver_flush();
}

/// After `Leaf#a < Mid#b < <main>` was named at a flush: 20 samples of the
/// same path through new method entries (objects 0x20000 on), then a
/// flush whose detach, begun here, merges their stacks into the named one.
/// Returns the detach and the names it resolves.
fn the_named_path_again(
    st: &mut SamplerState,
) -> (super::flush::Detaching, FastHashMap<FrameRef, FrameInfo>) {
    let mut again = Vec::new();
    for i in 0..20u64 {
        let frames = [8 * (i + 200), 8 * (i + 300), 16];
        record(st, ObjectAddress(0x20000 + i as usize * 0x40), &frames);
        again.push((8 * (i + 200), "Leaf#a"));
        again.push((8 * (i + 300), "Mid#b"));
    }
    again.push((16, "<main>"));
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    while !st.measure_live(
        &measuring,
        InuseCutoff::at_flush(0),
        usize::MAX,
        &mut |_| Some(40),
    ) {}
    let (_snapshot, naming) = st.end_snapshot(measuring, &mut |_| Some(40));
    let detaching = st.begin_detach(naming, &FastHashMap::default());
    (detaching, names(&again))
}

/// A detach in batches moves the samples of merged stacks a chunk of
/// records at a time: meanwhile a sample freed on a merged stack releases
/// the stack it went to, and no new stack takes a merged id.
#[test]
fn samples_of_merged_stacks_follow_them_between_batches() {
    let mut st = state(1_000, 1_000);
    // 20 paths, named at a first flush.
    name_the_path(&mut st, 0);
    assert_eq!(st.stacks().len(), 1, "one path by name");
    // The same path again, through new method entries: merges at the
    // next detach, which runs in batches of 2 stacks.
    let (detaching, names) = the_named_path_again(&mut st);
    let mut batches = 0;
    let mut freed = Vec::new();
    while !st.detach_frames_batch(&detaching, &names, 2) {
        batches += 1;
        if batches == 6 {
            // Some stacks merged, their samples not moved yet: they are
            // freed, and a new sample taken, in between.
            assert!(st.stacks().is_forwarding());
            let on_merged: Vec<ObjectAddress> = st
                .live
                .iter()
                .filter(|(_, id)| {
                    let stack = st.records[id.0 as usize].stack;
                    st.stacks().forwarded(stack) != stack
                })
                .map(|(&object, _)| object)
                .collect();
            assert!(on_merged.len() >= 2, "{}", on_merged.len());
            for object in on_merged {
                assert!(st.record_free(object));
                freed.push(object);
            }
            record(&mut st, ObjectAddress(0x30000), &[8 * 999, 16]);
        }
    }
    assert!(batches >= 9, "{batches}");
    assert!(!st.stacks().is_forwarding());
    st.finish_flush(detaching);
    // The named path and the new sample's stack.
    assert_eq!(st.stacks().len(), 2);
    assert_eq!(st.live_count(), 20 + 20 - freed.len() + 1);
    // Every sample is on a stored stack, and frees release them all.
    for i in 0..20usize {
        assert!(st.record_free(ObjectAddress(0x10000 + i * 0x40)));
        let object = 0x20000 + i * 0x40;
        assert_eq!(
            st.record_free(ObjectAddress(object)),
            !freed.contains(&ObjectAddress(object))
        );
    }
    assert!(st.record_free(ObjectAddress(0x30000)));
    let snapshot = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    // (The sample taken during the detach, in this interval's allocations.)
    assert_eq!(snapshot.heap_samples, 0);
    assert_eq!(snapshot.allocation_samples, 1);
    assert!(st.stacks().is_empty());
}

/// A flush cut short while its detach forwards merged stacks (a killed
/// flushing thread) does not move every sample then, in one hold: the
/// stacks stay forwarded, the next flush reports each path once, and its
/// detach moves the samples and lets the merged ids go.
#[test]
fn a_detach_cut_short_leaves_merged_stacks_to_the_next_flush() {
    let mut st = state(1_000, 1_000);
    // More samples on the named path than a batch's chunk of records, so
    // that the merged stacks' samples (taken last) wait for a later chunk.
    name_the_path(&mut st, 200);
    let (detaching, names_again) = the_named_path_again(&mut st);
    // Every stack detached (all merged into the named path), and only the
    // first chunk of records moved (the named path's own): cut short here,
    // with the 20 samples on merged stacks still to move.
    while st.remap_from.is_none() {
        assert!(!st.detach_frames_batch(&detaching, &names_again, 1));
    }
    assert!(st.stacks().is_forwarding());
    let on_merged = |st: &SamplerState| {
        st.live
            .iter()
            .filter(|(_, id)| {
                let stack = st.records[id.0 as usize].stack;
                st.stacks().forwarded(stack) != stack
            })
            .count()
    };
    assert_eq!(on_merged(&st), 20);
    st.end_flush();
    assert!(st.stacks().is_forwarding(), "left to the next flush");
    assert_eq!(on_merged(&st), 20);
    assert_eq!(st.stacks().len(), 1);
    // The next flush: one path, with all 40 samples.
    let measuring = st.begin_flush();
    while !st.measure_live(
        &measuring,
        InuseCutoff::at_flush(0),
        usize::MAX,
        &mut |_| Some(40),
    ) {}
    let (snapshot, naming) = st.end_snapshot(measuring, &mut |_| Some(40));
    assert_eq!(snapshot.heap_samples, 240);
    assert_eq!(snapshot.stacks.len(), 1, "each path once");
    let detaching = st.begin_detach(naming, &FastHashMap::default());
    while !st.detach_frames_batch(&detaching, &FastHashMap::default(), 1) {}
    st.finish_flush(detaching);
    assert!(!st.stacks().is_forwarding());
    assert_eq!(on_merged(&st), 0);
    // Every sample is on the stored stack, and frees release them all.
    for i in 0..20usize {
        assert!(st.record_free(ObjectAddress(0x10000 + i * 0x40)));
        assert!(st.record_free(ObjectAddress(0x20000 + i * 0x40)));
    }
    for j in 0..200usize {
        assert!(st.record_free(ObjectAddress(0x40000 + j * 0x40)));
    }
    let _ = st.take_snapshot(0, |_| Some(40));
    st.deliver_flush();
    assert!(st.stacks().is_empty());
}

/// The same for the allocation list: a sample taken after a flush's
/// snapshot, on a stack that flush's detach merges before it is cut short,
/// is read by the next flush through the forwarding (one path, not two).
#[test]
fn an_allocation_on_a_merged_stack_is_read_through_the_forwarding() {
    let mut st = state(1_000, 1_000);
    for i in 0..100usize {
        record(&mut st, ObjectAddress(0x10000 + i * 0x40), &[8, 16]);
    }
    st.measure_pending(|_| Some(40));
    st.take_snapshot(0, |_| Some(40));
    st.detach_resolved_frames(&names(&[(8, "A#a"), (16, "<main>")]));
    st.deliver_flush();
    record(&mut st, ObjectAddress(0x2000), &[24, 32]);
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    while !st.measure_live(
        &measuring,
        InuseCutoff::at_flush(0),
        usize::MAX,
        &mut |_| Some(40),
    ) {}
    let (_snapshot, naming) = st.end_snapshot(measuring, &mut |_| Some(40));
    // In the next interval's allocation list, on the stack merged below.
    record(&mut st, ObjectAddress(0x3000), &[24, 32]);
    st.measure_pending(|_| Some(40));
    let detaching = st.begin_detach(naming, &FastHashMap::default());
    let renamed = names(&[(24, "A#a"), (32, "<main>")]);
    while st.remap_from.is_none() {
        assert!(!st.detach_frames_batch(&detaching, &renamed, 1));
    }
    assert!(st.stacks().is_forwarding());
    st.end_flush();
    let snapshot = st.take_snapshot(0, |_| Some(40));
    // Its own and the one the flush cut short gave back, on one path.
    assert_eq!(snapshot.allocation_samples, 2);
    assert_eq!(snapshot.stacks.len(), 1, "each path once");
    st.deliver_flush();
}

/// More stacks fall unused during a flush than its end removes at once:
/// `prune_unused` removes the rest in chunks (nothing else would before
/// the next flush: a release removes only its own stack).
#[test]
fn stacks_unused_after_a_flush_are_pruned_in_chunks() {
    let mut st = state(0, 5_000);
    for i in 0..3_000usize {
        record(
            &mut st,
            ObjectAddress(0x10000 + i * 0x40),
            &[8 * (i as u64 + 1), 16],
        );
    }
    st.measure_pending(|_| Some(40));
    // Every live sample dies during the flush: 3,000 stacks queued.
    st.take_snapshot(0, |_| Some(40));
    for i in 0..3_000usize {
        st.record_free(ObjectAddress(0x10000 + i * 0x40));
    }
    st.deliver_flush();
    assert_eq!(st.stacks().len(), 3_000 - 1_024);
    let mut chunks = 0;
    while !st.prune_unused(500) {
        chunks += 1;
    }
    assert_eq!(chunks, 3);
    assert!(st.stacks().is_empty());
    assert_eq!(st.stacks().unused_len(), 0);
}

#[test]
#[cfg_attr(miri, ignore = "200,000 samples: slow under Miri")]
fn a_large_live_map_is_thinned_a_step_per_sample_and_stays_unbiased() {
    // A map of 40,000 over 100,000 live samples (every 101st weighing 5,000
    // among ones of 100): the thinning's threshold comes from a sample of
    // the weights, each new sample thins the next records, and the map
    // runs over its cap by at most one sample per step still to go.
    const HEAVY: ObjectAddress = ObjectAddress(0x4000_0000);
    const CAP: usize = 40_000;
    for seed in 0..3 {
        let mut st = SamplerState::new(GapSampler::new(1.0, seed), 10, CAP);
        st.reseed(seed);
        let (mut heavy_truth, mut light_truth) = (0.0, 0.0);
        let mut steps_seen = 0;
        for i in 0..100_000usize {
            let (object, weight) = if i % 101 == 100 {
                heavy_truth += 5_000.0;
                (ObjectAddress(HEAVY.0 + i * 40), 5_000.0)
            } else {
                light_truth += 100.0;
                (ObjectAddress(0x1000 + i * 40), 100.0)
            };
            let admission = st.admission(weight);
            st.record_allocation(object, ObjectInfo::default(), &frames(&[8]), admission);
            if st.thinning_from.is_some() {
                steps_seen += 1;
            }
            let bound = CAP + st.records.len() / THINNING_STEP + 1;
            assert!(
                st.live_count() <= bound,
                "seed {seed}: {} > {bound}",
                st.live_count()
            );
        }
        assert!(
            steps_seen > 10,
            "seed {seed}: thinned in {steps_seen} steps"
        );
        let snap = st.take_snapshot(0, |object| Some(if object >= HEAVY { 1_000 } else { 40 }));
        let (heavy, light) = heavy_and_light(&snap);
        assert_eq!(heavy, heavy_truth, "seed {seed}");
        assert!(
            (light / light_truth - 1.0).abs() < 0.05,
            "seed {seed}: {light} of {light_truth}"
        );
    }
}

/// A tiny live map beside a long allocation list (thinnings over many
/// records, heavy samples coming in while they go on) still estimates the
/// heavy samples without bias.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri")]
fn a_tiny_map_beside_many_records_does_not_refuse_heavy_samples() {
    const HEAVY: ObjectAddress = ObjectAddress(0x4000_0000);
    let (seeds, heavies) = (400u64, 30usize);
    let ratios: Vec<f64> = (0..seeds)
        .map(|seed| {
            let mut st = SamplerState::new(GapSampler::new(1.0, seed), 1_000_000, 2);
            st.reseed(seed);
            for i in 0..3_000usize {
                offer(&mut st, ObjectAddress(0x1000 + i * 40), 1.0, 8);
            }
            for i in 0..heavies {
                offer(&mut st, ObjectAddress(HEAVY.0 + i * 40), 1e6, 9);
            }
            let snap = st.take_snapshot(0, |object| Some(if object >= HEAVY { 1_000 } else { 40 }));
            let heavy: f64 = snap
                .samples
                .iter()
                .map(|sample| sample.values[2])
                .filter(|&objects| objects >= 1e6)
                .sum();
            heavy / (heavies as f64 * 1e6)
        })
        .collect();
    let n = seeds as f64;
    let mean = ratios.iter().sum::<f64>() / n;
    let se = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt();
    assert!(
        (mean - 1.0).abs() < 3.0 * se,
        "heavy in-use {mean} of truth, se {se}"
    );
}

/// Found in review: with 20,000 records in the allocation list and a cap
/// of 10, a thinning of 1,024 records a sample took 20 samples, in which
/// heavy ones (kept whole) filled the map to twice its cap. Steps now grow
/// with the records, so a thinning ends within half the cap's samples.
#[test]
fn a_thinning_ends_within_half_the_caps_samples() {
    for seed in 0..5 {
        let mut st = SamplerState::new(GapSampler::new(1.0, seed), 1_000_000, 10);
        st.reseed(seed);
        for i in 0..20_000usize {
            offer(&mut st, ObjectAddress(0x1000 + i * 40), 1.0, 8);
        }
        for i in 0..200usize {
            offer(
                &mut st,
                ObjectAddress(0x4000_0000 + i * 40),
                1e6 * (1.0 + i as f64),
                9,
            );
            assert!(
                st.live_count() <= 10 + 5 + 1,
                "seed {seed}: {}",
                st.live_count()
            );
        }
    }
}

/// A full live map (7,168 samples at scattered addresses) and a key whose
/// removal leaves its table full (a deleted marker amid occupied slots).
fn full_map_and_a_key_whose_removal_leaves_it_full() -> (SamplerState, ObjectAddress, ObjectAddress)
{
    // 7,168 live samples fill the live map's table exactly (no growth yet),
    // at scattered addresses (a removal amid a run of full slots leaves a
    // tombstone, and the table stays full).
    use rand::SeedableRng;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut st = state(10, 1_000_000);
    let mut objects = Vec::new();
    while st.live_count() < 7_168 {
        let object = 0x10_0000 + rng.random_range(0..1usize << 30) * 40;
        let object = ObjectAddress(object);
        if st.live.get(&object).is_none() {
            record(&mut st, object, &[8]);
            objects.push(object);
        }
    }
    let a = *objects
        .iter()
        .find(|a| st.live.full_after_removing(a))
        .expect("a key whose removal leaves a tombstone");
    let b = *objects.iter().find(|&&b| b != a).unwrap();
    (st, a, b)
}

/// Found in review: compaction moving a sample onto a key whose free was
/// missed, in a live map whose table is full, left the stale entry in the
/// previous table, where moving later wrote it over the new one.
#[test]
fn relocating_onto_a_stale_key_of_a_full_live_map_drops_the_stale_sample() {
    let (mut st, from, onto) = full_map_and_a_key_whose_removal_leaves_it_full();
    let n = st.live_count();
    let a = *st.live.get(&from).unwrap();
    let b = *st.live.get(&onto).unwrap();
    // `from` moves onto `onto`, whose free was missed: that sample is gone.
    st.relocate_objects(|x| if x == from { onto } else { x });
    assert_eq!(st.live.get(&onto), Some(&a));
    assert_eq!(st.live_count(), n - 1, "stale entry kept");
    assert_eq!(
        st.records[b.0 as usize].marks.liveness(),
        Liveness::Freed,
        "stale not released"
    );
}

#[test]
fn relocating_onto_a_stale_key_of_a_full_live_map_keeps_the_moved_id() {
    let (mut st, from, onto) = full_map_and_a_key_whose_removal_leaves_it_full();
    let a = *st.live.get(&from).unwrap();
    st.relocate_objects(|x| if x == from { onto } else { x });
    assert_eq!(st.live.get(&onto), Some(&a));
    // Later samples move the previous table's entries over.
    for i in 0..20 {
        record(&mut st, ObjectAddress(0x9000_0000 + i * 40), &[8]);
    }
    assert_eq!(st.live.get(&onto), Some(&a), "found under the stale id");
    assert!(st.record_free(onto));
    assert_eq!(st.live.get(&onto), None, "stale entry resurfaces");
}
