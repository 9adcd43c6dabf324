//! A flush read out, detached and ended in chunks while other threads
//! take and free samples in between: references, forwarding and names
//! stay right at every step.

use super::*;
use crate::stack_table::{Frame, FrameInfo};
use crate::types::{is_resolved_frame, FrameRef};
use rand::RngExt;

fn frames(ids: &[u64]) -> Vec<Frame> {
    ids.iter()
        .map(|&frame| Frame {
            frame: FrameRef(frame),
            line: 1,
        })
        .collect()
}

fn state(max_alloc: usize, max_heap: usize) -> SamplerState {
    SamplerState::new(GapSampler::new(1.0, 1), max_alloc, max_heap)
}

fn rec(
    st: &mut SamplerState,
    object: ObjectAddress,
    class: u64,
    stack: &[u64],
) -> Option<SampleId> {
    let admission = st.admission(1.0);
    st.record_allocation(
        object,
        ObjectInfo::new(ClassRef(class), 0),
        &frames(stack),
        admission,
    )
}

fn info(name: &str) -> FrameInfo {
    FrameInfo {
        name: name.to_string(),
        filename: Some("app.rb".into()),
        start_line: 1,
        blocks: None,
    }
}

/// Every record in use holds one reference on the stack it (forwarded) is
/// on, and the table holds no other reference.
fn check_refs(st: &SamplerState, what: &str) {
    let mut counts: FastHashMap<StackId, u64> = FastHashMap::default();
    // (A parked sample holds none: held_interval.rs.)
    for r in st
        .records
        .iter()
        .filter(|r| r.refs > 0 && !r.marks.parked())
    {
        *counts.entry(st.stacks.forwarded(r.stack)).or_insert(0) += 1;
    }
    for (&id, &n) in &counts {
        assert_eq!(u64::from(st.stacks.refs(id)), n, "{what}: stack {id:?}");
    }
    assert_eq!(
        st.stacks.total_refs(),
        counts.values().sum::<u64>(),
        "{what}: total refs"
    );
}

fn free_all(st: &mut SamplerState, objects: impl IntoIterator<Item = ObjectAddress>) {
    for o in objects {
        st.record_free(o);
    }
    st.clear();
    let _ = st.take_snapshot(0, |_| Some(8));
    st.deliver_flush();
    st.clear();
    assert!(st.stacks.is_empty(), "stacks left: {}", st.stacks.len());
    assert_eq!(st.stacks.frame_count(), 0);
    assert_eq!(st.stacks.resolved_frame_count(), 0);
    assert_eq!(st.named_class_count(), 0);
}

/// Samples moved in several record chunks (max_stacks 1 -> 64 records a
/// chunk), with frees of unmoved samples and new samples between chunks:
/// no new stack ever takes an id still forwarded.
#[test]
fn records_remapped_in_chunks_with_frees_and_new_samples() {
    let mut st = state(100_000, 100_000);
    let mut objects: Vec<ObjectAddress> = Vec::new();
    let mut next = 0x100000usize;
    let mut first_names = FastHashMap::default();
    for i in 0..300u64 {
        rec(&mut st, ObjectAddress(next), 0x5000, &[8 * (i + 1000), 16]);
        objects.push(ObjectAddress(next));
        next += 0x40;
        first_names.insert(FrameRef(8 * (i + 1000)), info("Leaf#a"));
    }
    first_names.insert(FrameRef(16), info("<main>"));
    st.measure_pending(|_| Some(40));
    st.take_snapshot(0, |_| Some(40));
    st.detach_resolved_frames(&first_names);
    st.deliver_flush();
    check_refs(&st, "after first");
    assert_eq!(st.stacks.len(), 1);
    // Same path through new frame values: all merge at the next detach.
    let mut again = FastHashMap::default();
    for i in 0..300u64 {
        rec(&mut st, ObjectAddress(next), 0x5000, &[8 * (i + 5000), 16]);
        objects.push(ObjectAddress(next));
        next += 0x40;
        again.insert(FrameRef(8 * (i + 5000)), info("Leaf#a"));
    }
    again.insert(FrameRef(16), info("<main>"));
    st.measure_pending(|_| Some(40));
    let measuring = st.begin_flush();
    while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 7, &mut |_| Some(40)) {}
    while !st.read_allocations(&measuring, 13, &mut |_| Some(40)) {}
    let (mut snap, naming) = st.end_snapshot_samples(measuring, &mut |_| Some(40));
    while !st.copy_stacks(&naming, &mut snap, 11) {}
    let mut classes = FastHashMap::default();
    classes.insert(ClassRef(0x5000), "Foo".to_string());
    let detaching = st.begin_detach(naming, &classes);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut calls = 0;
    let mut saw_remap_chunks = 0;
    while !st.detach_frames_batch(&detaching, &again, 1) {
        calls += 1;
        if st.remap_from.is_some() {
            saw_remap_chunks += 1;
        }
        // Free a few random samples (some on merged stacks, not moved yet).
        for _ in 0..3 {
            if objects.is_empty() {
                break;
            }
            let k = rng.random_range(0..objects.len());
            let o = objects.swap_remove(k);
            st.record_free(o);
        }
        // New samples (reusing freed record slots): never on a forwarded id.
        for _ in 0..3 {
            let leaf = 8 * rng.random_range(9000..9010u64);
            let id = rec(&mut st, ObjectAddress(next), 0x5000, &[leaf, 16]).expect("sampled");
            objects.push(ObjectAddress(next));
            next += 0x40;
            let stack = st.records[id.0 as usize].stack;
            assert_eq!(
                st.stacks.forwarded(stack),
                stack,
                "new sample on a forwarded id"
            );
        }
        check_refs(&st, "between batches");
    }
    assert!(calls > 300);
    assert!(saw_remap_chunks >= 5, "{saw_remap_chunks}");
    assert!(!st.stacks.is_forwarding());
    check_refs(&st, "after detach");
    st.finish_flush(detaching);
    check_refs(&st, "after finish");
    free_all(&mut st, objects);
}

/// end_flush at every step of a chunked flush (as a killed thread or a
/// forked child would): refcounts stay right and everything can be freed.
#[test]
fn end_flush_at_every_step() {
    for stop_at in 0..200usize {
        let mut st = state(100_000, 100_000);
        let mut objects: Vec<ObjectAddress> = Vec::new();
        let mut next = 0x100000usize;
        let mut names1 = FastHashMap::default();
        for i in 0..100u64 {
            rec(
                &mut st,
                ObjectAddress(next),
                0x5000 + 8 * (i % 3),
                &[8 * (i % 10 + 1000), 16],
            );
            objects.push(ObjectAddress(next));
            next += 0x40;
            names1.insert(FrameRef(8 * (i % 10 + 1000)), info(&format!("M{}", i % 5)));
        }
        names1.insert(FrameRef(16), info("<main>"));
        st.measure_pending(|_| Some(40));
        st.take_snapshot(0, |_| Some(40));
        st.detach_resolved_frames(&names1);
        st.deliver_flush();
        let mut names2 = FastHashMap::default();
        for i in 0..200u64 {
            rec(
                &mut st,
                ObjectAddress(next),
                0x5000 + 8 * (i % 3),
                &[8 * (i % 20 + 2000), 16],
            );
            objects.push(ObjectAddress(next));
            next += 0x40;
            names2.insert(FrameRef(8 * (i % 20 + 2000)), info(&format!("M{}", i % 7)));
        }
        names2.insert(FrameRef(16), info("<main>"));
        st.measure_pending(|_| Some(40));
        let mut step = 0usize;
        let churn = |st: &mut SamplerState, objects: &mut Vec<ObjectAddress>, next: &mut usize| {
            if let Some(o) = objects.pop() {
                st.record_free(o);
            }
            let id = rec(st, ObjectAddress(*next), 0x5000, &[8 * 3000, 16]).unwrap();
            let _ = id;
            objects.push(ObjectAddress(*next));
            *next += 0x40;
        };
        'flush: {
            let measuring = st.begin_flush();
            while !st.measure_live(&measuring, InuseCutoff::at_flush(0), 17, &mut |_| Some(40)) {
                step += 1;
                churn(&mut st, &mut objects, &mut next);
                if step == stop_at {
                    st.end_flush();
                    break 'flush;
                }
            }
            while !st.read_allocations(&measuring, 17, &mut |_| Some(40)) {
                step += 1;
                churn(&mut st, &mut objects, &mut next);
                if step == stop_at {
                    st.end_flush();
                    break 'flush;
                }
            }
            let (mut snap, naming) = st.end_snapshot_samples(measuring, &mut |_| Some(40));
            while !st.copy_stacks(&naming, &mut snap, 17) {
                step += 1;
                churn(&mut st, &mut objects, &mut next);
                if step == stop_at {
                    st.end_flush();
                    break 'flush;
                }
            }
            let classes: FastHashMap<ClassRef, String> = (0..3u64)
                .map(|c| (ClassRef(0x5000 + 8 * c), format!("C{c}")))
                .collect();
            let detaching = st.begin_detach(naming, &classes);
            while !st.detach_frames_batch(&detaching, &names2, 1) {
                step += 1;
                churn(&mut st, &mut objects, &mut next);
                check_refs(&st, "mid detach");
                if step == stop_at {
                    st.end_flush();
                    break 'flush;
                }
            }
            st.finish_flush(detaching);
        }
        check_refs(&st, &format!("stop_at {stop_at}"));
        // A following full flush works too.
        let _ = st.take_snapshot(0, |_| Some(40));
        st.detach_resolved_frames(&FastHashMap::default());
        st.deliver_flush();
        check_refs(&st, "next flush");
        free_all(&mut st, objects);
    }
}

/// The state fuzz extended: chunked reads/copies, frees and samples at
/// every step, class names, early end_flush at any step.
#[test]
fn random_chunked_flushes_with_churn_and_early_ends() {
    for seed in 0..300u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let cap = if seed % 2 == 0 { 60 } else { 400 };
        let mut st = state(rng.random_range(5..cap), rng.random_range(5..cap));
        let mut objects: Vec<ObjectAddress> = Vec::new();
        let mut next = 0x1000usize;
        let classes: Vec<ClassRef> = (1..5u64).map(|c| ClassRef(0x8000 + 8 * c)).collect();
        let churn = |st: &mut SamplerState,
                     rng: &mut SmallRng,
                     objects: &mut Vec<ObjectAddress>,
                     next: &mut usize| {
            for _ in 0..rng.random_range(0..4) {
                let depth = rng.random_range(0..4usize);
                let stack: Vec<u64> = (0..depth).map(|_| 8 * rng.random_range(1..9u64)).collect();
                let class = classes[rng.random_range(0..classes.len())];
                if rec(st, ObjectAddress(*next), class.0, &stack).is_some() {
                    objects.push(ObjectAddress(*next));
                }
                *next += 40;
            }
            for _ in 0..rng.random_range(0..4) {
                if objects.is_empty() {
                    break;
                }
                let k = rng.random_range(0..objects.len());
                let o = objects.swap_remove(k);
                st.record_free(o);
            }
            if rng.random_bool(0.3) {
                st.measure_pending(|_| Some(8));
            }
        };
        for round in 0..25 {
            churn(&mut st, &mut rng, &mut objects, &mut next);
            st.measure_pending(|_| Some(8));
            let stop = if rng.random_bool(0.3) {
                rng.random_range(0..30usize)
            } else {
                usize::MAX
            };
            let mut step = 0usize;
            let stop_now = |step: &mut usize| {
                *step += 1;
                *step == stop
            };
            'flush: {
                let measuring = st.begin_flush();
                while !st.measure_live(
                    &measuring,
                    InuseCutoff::at_flush(0),
                    rng.random_range(1..5),
                    &mut |_| Some(8),
                ) {
                    churn(&mut st, &mut rng, &mut objects, &mut next);
                    if stop_now(&mut step) {
                        st.end_flush();
                        break 'flush;
                    }
                }
                while !st.read_allocations(&measuring, rng.random_range(1..5), &mut |_| Some(8)) {
                    churn(&mut st, &mut rng, &mut objects, &mut next);
                    if stop_now(&mut step) {
                        st.end_flush();
                        break 'flush;
                    }
                }
                let (mut snap, naming) = st.end_snapshot_samples(measuring, &mut |_| Some(8));
                while !st.copy_stacks(&naming, &mut snap, rng.random_range(1..5)) {
                    churn(&mut st, &mut rng, &mut objects, &mut next);
                    if stop_now(&mut step) {
                        st.end_flush();
                        break 'flush;
                    }
                }
                for s in &snap.samples {
                    assert!(snap.stacks.contains_key(&s.stack));
                }
                let mut names: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
                for fs in snap.stacks.values() {
                    for f in fs.iter() {
                        if !is_resolved_frame(f.frame) {
                            names.insert(f.frame, info(&format!("m{}", f.frame.0 % 24)));
                        }
                    }
                }
                let class_names: FastHashMap<ClassRef, String> = st
                    .flush_classes()
                    .iter()
                    .map(|&c| (c, format!("K{}", c.0 % 3)))
                    .collect();
                churn(&mut st, &mut rng, &mut objects, &mut next);
                if rng.random_bool(0.1) {
                    st.end_flush();
                    break 'flush;
                }
                let detaching = st.begin_detach(naming, &class_names);
                while !st.detach_frames_batch(&detaching, &names, rng.random_range(1..3)) {
                    if st.stacks.is_forwarding() {
                        FWD_CHURN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if st.remap_from.is_some_and(|r| r > 0) && st.stacks.is_forwarding() {
                        MID_REMAP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    churn(&mut st, &mut rng, &mut objects, &mut next);
                    check_refs(&st, &format!("seed {seed} round {round} detaching"));
                    if stop_now(&mut step) {
                        if st.stacks.is_forwarding() {
                            FWD_END.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        st.end_flush();
                        break 'flush;
                    }
                }
                st.finish_flush(detaching);
            }
            check_refs(&st, &format!("seed {seed} round {round}"));
            if rng.random_bool(0.05) {
                st.clear();
                objects.clear();
            }
        }
        free_all(&mut st, objects);
    }
    eprintln!(
        "coverage: churn while forwarding {}, mid-remap {}, end while forwarding {}",
        FWD_CHURN.load(std::sync::atomic::Ordering::Relaxed),
        MID_REMAP.load(std::sync::atomic::Ordering::Relaxed),
        FWD_END.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(MID_REMAP.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(FWD_END.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

static FWD_CHURN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static MID_REMAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static FWD_END: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
