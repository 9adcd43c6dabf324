//! `Collector#flush`: the steps of a flush (sampler/state/flush.rs) in
//! chunks, with other threads let in between, then the profile built.
//!
//! Called from a Ruby method (GVL held, outside GC, never from a hook), one
//! flush at a time (`flushing`). Between chunks another thread may take
//! samples, flush the same collector (refused), fork, or kill this one: a
//! flush ended anywhere is ended by `FlushEnd`'s drop, which gives what it
//! took of the interval back to the next flush unless the profile was
//! delivered. Nothing that lets other threads run (where Ruby raises
//! pending interrupts) comes after the delivery. The lock is never held
//! across a Ruby call or a GVL release.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::ruby::classes::resolve_classes;
use crate::ruby::convert::object_value;
use crate::ruby::errors::{RbError, RbResult};
use crate::ruby::frames::resolve_frames;
use crate::ruby::gvl::{current_thread, GvlHolds};
use crate::ruby::heap;
use crate::ruby::labels;
use crate::ruby::process_identity;
use crate::ruby::registry;
use crate::ruby::window_timer;
use pprof::function_errors::FunctionSpreadInputs;
use pprof::heap_profile::{build_profile_gzipped, ProfileMeta, SampleLabels, MISSED_FRAME};
use pprof::inuse_comment::format_inuse_comment;
use pprof::spread_comment::{format_spread_comment, total_spreads, TotalSpread};
use sampler::gaps::mix_seed;
use sampler::spread::{spreads, widen_for_unobserved, UnseenWeights};
use sampler::state::{DropCounters, InuseCutoff};
use sampler::types::ObjectAddress;
use sampler::windows::{IntervalTally, WindowPolicy};

use super::{window_seed, Collector, Sampler};

/// Stacks converted to named frames per step of a flush's last part (about
/// a millisecond each at depth 50).
const DETACH_BATCH: usize = 1024;

/// Stacks copied, and allocation samples read, for a flush under one hold
/// of the lock.
const STACK_COPY_CHUNK: usize = 1024;
const ALLOCATION_CHUNK: usize = 8_192;

/// Samples of a delivered flush, and stacks that fell unused during it,
/// released after it in chunks (`tidy_after_flush`).
const PRUNE_CHUNK: usize = 1_024;
const RELEASE_CHUNK: usize = 1_024;
/// Between two of those chunks (from the postponed job).
const TIDY_AGAIN_NS: u64 = 1_000_000;

/// A flush that lets other threads run does so once it has held the GVL
/// this long, where its steps can tell.
const YIELD_AFTER: Duration = Duration::from_millis(2);

/// Live objects measured per step of a flush (about half a millisecond).
const LIVE_CHUNK: usize = 4_096;

/// The result of a flush, before it becomes Ruby objects.
pub struct FlushResult {
    pub pprof: Vec<u8>,
    pub allocation_samples: usize,
    pub heap_samples: usize,
    pub drops: DropCounters,
    pub sample_rate: f64,
    pub started_at: SystemTime,
    pub finished_at: SystemTime,
    pub flush_duration_nanos: u64,
    pub serialization_nanos: u64,
    /// The longest the flush held the GVL at a stretch (without
    /// `proactively_yield_gvl`, all of it but the build without the GVL).
    pub longest_gvl_hold_nanos: u64,
    /// Samples folded into "(other)" to respect max_profile_bytes.
    pub folded_samples: usize,
    /// Share of the interval's allocations made while the NEWOBJ hook was
    /// on (1.0 without sampling windows).
    pub window_coverage: f64,
    /// How sure each value's total is (alloc_objects, alloc_space,
    /// inuse_objects, inuse_space).
    pub spreads: [TotalSpread; 4],
}

#[derive(Debug, Clone, Copy, Default)]
pub struct FlushOptions {
    /// Build and compress the profile without holding the GVL.
    pub yield_gvl: bool,
    /// Also let other threads run between the phases that need the GVL.
    pub proactively_yield_gvl: bool,
    /// Fold the smallest samples into "(other)" to stay under this many
    /// uncompressed bytes.
    pub max_profile_bytes: Option<usize>,
    /// The same, to have at most this many samples ("(other)" included).
    pub max_profile_samples: Option<usize>,
    /// Class and GC age as labels, the class as a leaf frame, or neither.
    pub sample_labels: SampleLabels,
}

impl Collector {
    pub fn flush(&self, options: FlushOptions) -> RbResult<FlushResult> {
        let pid = std::process::id();
        if self.flushing.swap(true, Ordering::Acquire) {
            if self.flushing_pid.load(Ordering::Relaxed) == pid {
                return Err(RbError::state(
                    "flush is already in progress on this collector (flush called from within a flush?)",
                ));
            }
            // Inherited from a parent that forked while another of its
            // threads was flushing: that flush will never end here, and what
            // it took belongs to the parent's next profile. (The fork handler
            // resets only the collectors it knows are active.)
            self.end_flush(None);
            self.flushing.store(true, Ordering::Release);
        }
        self.flushing_pid.store(pid, Ordering::Relaxed);
        let result = {
            // Resets the flush state however flush_inner ends (even by panic),
            // giving the interval back unless the profile was delivered.
            let mut end = FlushEnd {
                collector: self,
                taken: IntervalTaken::default(),
            };
            self.flush_inner(options, &mut end.taken)
        };
        if result.is_ok() {
            // What it held goes from the postponed job (`tidy_after_flush`).
            registry::request_measurement();
            // FREEOBJ off once a stopped collector has no live samples left.
            // (The profile is delivered: a failure here must not lose it.)
            if self.apply_hooks().is_err() {
                self.count_internal_error();
            }
        }
        result
    }

    /// From the postponed job: releases a chunk of what delivered flushes
    /// left, their allocation samples and then the stacks that fell unused,
    /// and asks the windows' timer for the job again soon while some is
    /// left (a stopped collector's job has nothing else to wake it), so that
    /// the memory, and code the stacks' frames keep alive, go soon after a
    /// flush, a little at a time. What is left when the next flush begins,
    /// it releases first.
    pub(super) fn tidy_after_flush(&self) {
        let more = match self.sampler.try_lock() {
            Ok(mut sampler) => {
                let state = &mut sampler.state;
                // (A flush under way tidies first, and asks again after.)
                state.has_flush_leftovers()
                    && !state.flush_in_progress()
                    && !(state.release_delivered(RELEASE_CHUNK) && state.prune_unused(PRUNE_CHUNK))
            }
            Err(_) => true,
        };
        if more {
            window_timer::schedule_no_later(TIDY_AGAIN_NS, registry::request_measurement);
        }
    }

    /// Ends a flush: no thread is suppressed any more, stacks and classes no
    /// sample uses are forgotten, what the flush took of its interval goes
    /// back to the next flush unless it was delivered (or `taken` is None:
    /// a flush of the parent's, in a forked child), and the next flush may
    /// start.
    fn end_flush(&self, taken: Option<IntervalTaken>) {
        self.suppressed_thread.store(0, Ordering::Relaxed);
        if let Ok(mut sampler) = self.sampler.lock() {
            // A no-op after flush_inner's finish_flush; otherwise ends the
            // flush where it stopped, giving its samples back (unless a
            // `start!` cleared the state meanwhile: then the rest of what it
            // took belongs to no interval either).
            if taken.is_none() {
                sampler.state.discard_held();
            }
            let given_back = sampler.state.end_flush();
            if let Some(taken) = taken.filter(|t| given_back && !t.delivered) {
                if let Some(started_at) = taken.started_at {
                    sampler.interval_started_at = started_at;
                }
                if let Some(tally) = taken.windows {
                    sampler.windows.give_back(tally);
                }
                self.nolock_drops
                    .fetch_add(taken.nolock_drops, Ordering::Relaxed);
            }
        }
        self.flushing.store(false, Ordering::Release);
    }

    /// In a forked child: a flush that was running in another thread of the
    /// parent will never finish here, so its state is cleared; the child's
    /// interval starts now, without the parent's allocation samples (they
    /// are in the parent's next profile). Runs in the atfork child handler,
    /// after the lock was re-initialised; allocates no Ruby object.
    pub fn reset_after_fork_in_child(&self) {
        if self.flushing.load(Ordering::Relaxed) {
            // (The child's interval starts now: nothing to give back.)
            self.end_flush(None);
        }
        let counter = heap::allocation_counter();
        let gap = self.with_sampler(|s| {
            let pid = u64::from(std::process::id());
            s.state.start_child_interval(pid);
            let seed = mix_seed(window_seed(s.state.gaps.seed()), pid);
            s.windows.start_child_interval(counter, seed);
            s.interval_started_at = SystemTime::now();
            s.state.gaps.next_gap()
        });
        match gap {
            Ok(gap) => self.countdown.set(gap),
            Err(_) => self.count_internal_error(),
        }
        if self.windows_active.load(Ordering::Relaxed) {
            // The parent's timer thread is not here: the child's first job
            // polls the windows and starts one.
            registry::request_measurement();
        }
    }

    /// Runs a flush step until it says it is done, a chunk under each hold
    /// of the lock, letting other threads run once the GVL has been held
    /// `YIELD_AFTER` (when asked).
    fn in_chunks(
        &self,
        options: &FlushOptions,
        holds: &mut GvlHolds,
        mut step: impl FnMut(&mut Sampler) -> bool,
    ) -> RbResult<()> {
        while !self.with_sampler(&mut step)? {
            if options.proactively_yield_gvl {
                holds.yield_if_held(YIELD_AFTER)?;
            }
        }
        Ok(())
    }

    fn flush_inner(
        &self,
        options: FlushOptions,
        taken: &mut IntervalTaken,
    ) -> RbResult<FlushResult> {
        let began = Instant::now();
        let mut holds = GvlHolds::new();
        // 0. What delivered flushes left and the postponed job has not
        //    released yet (`tidy_after_flush`). Nothing of this interval is
        //    taken yet.
        self.in_chunks(&options, &mut holds, |s| {
            s.state.release_delivered(RELEASE_CHUNK)
        })?;
        self.in_chunks(&options, &mut holds, |s| s.state.prune_unused(PRUNE_CHUNK))?;
        let finished_at = SystemTime::now();
        // 1. Under the lock, with no Ruby allocation: read the samples out.
        //    Allocations from here on belong to the next flush. Live objects
        //    are measured in chunks, with the lock released and (when asked)
        //    other threads let run in between, so that a flush of a large
        //    heap never holds the GVL for long.
        let light = self.is_light();
        let mut measure = |object: ObjectAddress| heap::object_size(object_value(object));
        if light {
            self.settle_light()?;
        }
        let (gc_count, gc_under_way) = heap::gc_count_and_under_way();
        let cutoff = if self.inuse_at_flush.get() {
            InuseCutoff::at_flush(gc_count)
        } else {
            InuseCutoff::last_completed_gc(gc_count, gc_under_way)
        };
        // The steps and their order: sampler/state/flush.rs. On an error (the
        // thread killed while it let others run), the FlushEnd guard's
        // end_flush releases what the flush holds.
        let (measuring, sample_rate, started_at) = self.with_sampler(|s| {
            s.state.measure_pending(measure);
            let started_at = std::mem::replace(&mut s.interval_started_at, finished_at);
            (s.state.begin_flush(), s.state.gaps.rate(), started_at)
        })?;
        taken.started_at = Some(started_at);
        loop {
            // Light mode: which of the chunk's objects still live is found
            // first, in the same hold of the lock (pages listed just before,
            // no Ruby allocation in between).
            let pages = if light && !self.is_paused_for_ractors() {
                // Objects a compaction moved meanwhile are found again first.
                self.settle_light()?;
                Some(heap::HeapPages::now()?)
            } else {
                None
            };
            let done = self.with_sampler(|s| {
                if let Some(pages) = &pages {
                    s.state
                        .forget_dead_in_flush(&measuring, LIVE_CHUNK, |object, object_id| {
                            heap::is_same_object(pages, object, object_id)
                        });
                }
                s.state
                    .measure_live(&measuring, cutoff, LIVE_CHUNK, &mut measure)
            })?;
            if done {
                break;
            }
            // By time, like the other steps: a flush from a thread of its
            // own gives the others the GVL at each yield, for up to a time
            // slice when they are busy.
            if options.proactively_yield_gvl {
                holds.yield_if_held(YIELD_AFTER)?;
            }
        }
        // An allocation sample still unmeasured is sized here, if its
        // object's free is watched (not in light mode: its address could be
        // stale).
        let mut measure_unmeasured = |object: ObjectAddress| {
            if light {
                None
            } else {
                heap::object_size(object_value(object))
            }
        };
        // The allocation samples, in chunks (a million of them take tens of
        // milliseconds).
        self.in_chunks(&options, &mut holds, |s| {
            s.state
                .read_allocations(&measuring, ALLOCATION_CHUNK, &mut measure_unmeasured)
        })?;
        let (mut snapshot, naming, classes) = self.with_sampler(|s| {
            let (snapshot, naming) = s
                .state
                .end_snapshot_samples(measuring, &mut measure_unmeasured);
            (snapshot, naming, s.state.flush_classes().to_vec())
        })?;
        // The stacks' frames, in chunks (tens of thousands of deep stacks
        // take milliseconds to copy).
        self.in_chunks(&options, &mut holds, |s| {
            s.state
                .copy_stacks(&naming, &mut snapshot, STACK_COPY_CHUNK)
        })?;
        taken.nolock_drops = self.nolock_drops.swap(0, Ordering::Relaxed);
        snapshot.drops.nolock += taken.nolock_drops;
        // Sampling windows: samples already weigh 1 / their window's
        // probability (sampler/windows/mod.rs); nothing is rescaled here.
        let counter = heap::allocation_counter();
        let (window_flush, window_policy, warm_up, window_length) = self.with_sampler(|s| {
            (
                s.windows.flush(counter),
                s.windows.policy(),
                s.windows.warm_up(),
                s.windows.window_length(),
            )
        })?;
        taken.windows = Some(window_flush.tally);
        let windows = window_policy != WindowPolicy::Fixed(1.0);
        let coverage = window_flush.coverage;
        // Allocations windows missed: one sample of unknown site, sized as
        // this interval's sampled allocations are on average.
        let missed = (window_flush.missed_estimate > 0.0).then(|| {
            let (objects, bytes) = snapshot
                .samples
                .iter()
                .fold((0.0, 0.0), |(o, b), s| (o + s.values[0], b + s.values[1]));
            let mean_size = if objects > 0.0 { bytes / objects } else { 0.0 };
            let estimate = window_flush.missed_estimate;
            [estimate, estimate * mean_size, 0.0, 0.0]
        });
        // (Nothing hooked: alloc_* read 0 without having looked.)
        // Pure Rust over every sample: without the GVL if asked.
        let unseen = UnseenWeights {
            allocations: window_flush.window_sample_weight,
            inuse: window_flush.latest_window_sample_weight,
        };
        let mut value_spreads = if options.yield_gvl {
            holds.without_gvl(|| spreads(&snapshot.samples, unseen))?
        } else {
            spreads(&snapshot.samples, unseen)
        };
        let (allocated, inuse) = value_spreads.split_at_mut(2);
        widen_for_unobserved(allocated, window_flush.unwindowed_share);
        widen_for_unobserved(
            inuse,
            window_flush.inuse_missed_share + window_flush.inuse_unwindowed_share,
        );
        let spreads = total_spreads(&value_spreads, windows && coverage == 0.0);
        if options.proactively_yield_gvl {
            holds.yield_now()?;
        }

        // 2. Without the lock: name the frames (allocates Ruby strings, which
        //    this thread must not sample; the frames stay marked until
        //    `finish_flush` prunes them).
        self.suppressed_thread
            .store(current_thread(), Ordering::Relaxed);
        let yield_after = options.proactively_yield_gvl.then_some(YIELD_AFTER);
        let ruby_frames = resolve_frames(&snapshot.stacks, yield_after, &mut holds)?;
        let ruby_classes = resolve_classes(&classes)?;
        let process_identity = process_identity::current()?;
        let mut frames = std::mem::take(&mut snapshot.resolved_frames);
        frames.extend(ruby_frames.iter().map(|(&f, info)| (f, info.clone())));
        let mut class_names = std::mem::take(&mut snapshot.resolved_classes);
        class_names.extend(ruby_classes.iter().map(|(&c, name)| (c, name.clone())));
        self.suppressed_thread.store(0, Ordering::Relaxed);

        // 3. Pure Rust: build and compress the profile, without the GVL if
        //    asked.
        let serialization_began = Instant::now();
        let meta = ProfileMeta {
            label_names: labels::names(),
            function_spreads: Some(FunctionSpreadInputs {
                unseen,
                allocations_unobserved: window_flush.unwindowed_share,
                inuse_unobserved: window_flush.inuse_missed_share
                    + window_flush.inuse_unwindowed_share,
            }),
            time_nanos: unix_nanos(finished_at),
            duration_nanos: finished_at
                .duration_since(started_at)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            sample_rate,
            program: program_path(),
            comments: {
                let mut comments = vec![
                    process_identity.comment(),
                    format_inuse_comment(cutoff, snapshot.too_young),
                ];
                if !heap::can_measure_sizes() {
                    comments.push(
                        "object sizes unavailable on this Ruby (no rb_obj_memsize_of)".into(),
                    );
                }
                if windows {
                    let chosen = match window_policy {
                        WindowPolicy::Fixed(q) => format!("a share {q} of allocations"),
                        WindowPolicy::Budget(budget) => format!(
                            "a share of allocations chosen to hook about {budget} allocations a second"
                        ),
                    };
                    let warm_up = if warm_up > 0 {
                        format!(" after the first {warm_up} allocations since start")
                    } else {
                        String::new()
                    };
                    let mut missed = if window_flush.missed > 0 {
                        format!(
                            "; the hook came on too late for {} in-window allocations (a long C call, \
                             or a busy machine), standing for about {:.0}: shown as {MISSED_FRAME}, \
                             their sites unknown",
                            window_flush.missed, window_flush.missed_estimate
                        )
                    } else {
                        String::new()
                    };
                    if window_flush.inuse_missed_share > 0.0 {
                        missed.push_str(&format!(
                            "; windows missed {:.1}% of the allocations (this interval or since \
                             start, whichever is more): in-use leaves out those still alive, about \
                             that share if they live as long as the rest (counted in its error)",
                            window_flush.inuse_missed_share * 100.0
                        ));
                    }
                    if window_flush.inuse_unwindowed_share > 0.0 {
                        missed.push_str(&format!(
                            "; the block under way has not reached its window: {:.1}% of this \
                             interval's allocations ({:.1}% since start) are not counted yet, and \
                             its window's samples will stand for them (counted in the errors)",
                            window_flush.unwindowed_share * 100.0,
                            window_flush.inuse_unwindowed_share * 100.0
                        ));
                    }
                    // (The heaviest: a budget's blocks differ, and what samples cost
                    // may hold a window's rate below sample_rate / q. The caps'
                    // thinning raises weights after this.)
                    let heaviest = if window_flush.window_sample_weight > 0.0 {
                        format!(
                            ", up to {:.0} allocations this interval (more where the sample \
                             caps thinned them)",
                            window_flush.window_sample_weight
                        )
                    } else {
                        String::new()
                    };
                    comments.push(format!(
                        "sampling windows: {window_length}-allocation windows at random places, \
                         {chosen}{warm_up}; {} windows, in which the hook saw {:.2}% of this \
                         interval's allocations; each sample weighs 1 / (its window's sample rate \
                         x probability){heaviest}{missed}",
                        window_flush.windows,
                        coverage * 100.0
                    ));
                }
                comments.push(format_spread_comment(&spreads));
                comments
            },
            // (Room for the missed-allocations sample under the limits.)
            max_raw_bytes: options.max_profile_bytes.map(|b| {
                if missed.is_some() {
                    b.saturating_sub(256)
                } else {
                    b
                }
            }),
            max_samples: options.max_profile_samples.map(|n| {
                if missed.is_some() {
                    n.saturating_sub(1)
                } else {
                    n
                }
            }),
            sample_labels: options.sample_labels,
            missed,
        };
        let build = || build_profile_gzipped(&snapshot, &frames, &class_names, &meta);
        let (pprof, folded_samples) = if options.yield_gvl {
            holds.without_gvl(build)?
        } else {
            build()
        };
        // 4. The frames and classes just named are held by name from now on,
        //    no longer as Ruby objects kept alive (see StackTable::detach_frames
        //    and sampler::named_classes).
        //    In batches, letting other threads run in between (when asked),
        //    so that a flush after a busy interval never holds the GVL long.
        //    If this fails (the thread killed while it let others run), what
        //    is left stays Ruby frames until the next flush.
        let detaching = self.with_sampler(|s| s.state.begin_detach(naming, &ruby_classes))?;
        self.in_chunks(&options, &mut holds, |s| {
            s.state
                .detach_frames_batch(&detaching, &ruby_frames, DETACH_BATCH)
        })?;
        // 5. Delivered: from here on nothing may fail or let other threads
        //    run (an interrupt raised now would lose the profile). What it
        //    held is released after it (`tidy_after_flush`).
        self.with_sampler(|s| s.state.finish_flush(detaching))?;
        taken.delivered = true;
        Ok(FlushResult {
            pprof,
            folded_samples,
            allocation_samples: snapshot.allocation_samples,
            heap_samples: snapshot.heap_samples,
            drops: snapshot.drops,
            sample_rate,
            started_at,
            finished_at,
            flush_duration_nanos: began.elapsed().as_nanos() as u64,
            serialization_nanos: serialization_began.elapsed().as_nanos() as u64,
            longest_gvl_hold_nanos: holds.longest().as_nanos() as u64,
            window_coverage: coverage,
            spreads,
        })
    }
}

/// What a flush took of its interval besides the sampler state's part
/// (held_interval.rs): restored by `end_flush` unless it was delivered.
#[derive(Debug, Default)]
struct IntervalTaken {
    started_at: Option<SystemTime>,
    windows: Option<IntervalTally>,
    nolock_drops: u64,
    delivered: bool,
}

struct FlushEnd<'a> {
    collector: &'a Collector,
    taken: IntervalTaken,
}

impl Drop for FlushEnd<'_> {
    fn drop(&mut self) {
        self.collector
            .end_flush(Some(std::mem::take(&mut self.taken)));
    }
}
fn unix_nanos(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn program_path() -> String {
    std::fs::read_link("/proc/self/exe")
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| "ruby".to_string())
}
