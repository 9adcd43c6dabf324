//! The collector behind a `MemprofilerPprof::Collector` object: the sampler
//! state under its lock, the event hooks, and what the hooks and `flush` do
//! with them.

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rb_sys::{
    rb_gc_count, rb_gc_location, rb_gc_mark, rb_trace_arg_t, rb_tracearg_lineno,
    rb_tracearg_object, RUBY_EVENT_C_RETURN, RUBY_INTERNAL_EVENT_FREEOBJ,
    RUBY_INTERNAL_EVENT_NEWOBJ, VALUE,
};

use super::classes::{is_class_value, object_info, resolve_classes};
use super::convert::fixnum;
use super::errors::{RbError, RbResult};
use super::frames::{resolve_frames, BacktraceBuffer};
use super::gvl::{current_thread, GvlHolds};
use super::heap;
use super::hooks::Hook;
use super::registry::{self, Registered};
use super::window_timer::{self, monotonic_ns};
use crate::pprof::heap_profile::{build_profile_gzipped, ProfileMeta, SampleLabels, MISSED_FRAME};
use crate::pprof::spread_comment::{format_spread_comment, total_spreads, TotalSpread};
use crate::sampler::address_filter::AddressFilter;
use crate::sampler::gaps::{entropy_seed, mix_seed, GapSampler, SkipCountdown};
use crate::sampler::lock::{LockError, SamplerLock};
use crate::sampler::spread::{spreads, widen_for_unobserved, UnseenWeights};
use crate::sampler::state::{DropCounters, SamplerState};
use crate::sampler::windows::{WindowPolicy, Windows};

pub const DEFAULT_SAMPLE_RATE: f64 = 0.01;
/// Stacks converted to named frames per step of a flush's last part (about
/// a millisecond each at depth 50).
const DETACH_BATCH: usize = 1024;

/// Stacks copied, and allocation samples read, for a flush under one hold
/// of the lock.
const STACK_COPY_CHUNK: usize = 1024;
const ALLOCATION_CHUNK: usize = 8_192;

/// Stacks that fell unused during a flush, removed after it in chunks.
const PRUNE_CHUNK: usize = 1_024;

/// A flush that lets other threads run does so once it has held the GVL
/// this long, where its steps can tell.
const YIELD_AFTER: Duration = Duration::from_millis(2);
pub const DEFAULT_MAX_ALLOCATION_SAMPLES: usize = 10_000;
pub const DEFAULT_MAX_HEAP_SAMPLES: usize = 50_000;
/// Collector.new's sampling windows (with `mode: :light`, below 1.0): at
/// most about this many hooked allocations a second. At the 80-300 ns a
/// hooked allocation costs (bench/run callgrind alloc, deep; the Rails-depth
/// app at 165 frames), that is 0.4-1.5% of a core.
pub const DEFAULT_WINDOW_BUDGET: u64 = 50_000;
/// .. after every allocation is hooked for this many: a fraction of a
/// second of a busy server, and all of most short profiles (a block, a
/// test, a script), which are then complete at the sample rate. At the default rate that is 2,500 samples, a quarter of the
/// allocation reservoir. Why not more: a loop that allocates 4,000,000
/// objects from start pays the whole hook for this share of itself. Its
/// cost over no profiler, in instructions and on the clock (median of 15):
/// at 1,000,000, 1.10-1.13x and 1.15-1.16x; at 500,000, 1.06-1.07x and
/// 1.07-1.16x; at 250,000, 1.03-1.04x and 1.00-1.05x (bench/run callgrind
/// alloc deep --iterations 1000000, and bench/run alloc --runs 15;
/// docs/performance.md, the defaults).
pub const DEFAULT_WINDOW_WARM_UP: u64 = 250_000;

/// Samples that may wait before a postponed job measures them (each job
/// run costs a few hundred nanoseconds; a sample freed meanwhile is sized
/// in the FREEOBJ hook).
const MEASURE_BATCH: usize = 32;

/// Live objects measured per step of a flush (about half a millisecond).
const LIVE_CHUNK: usize = 4_096;

/// When freshly sampled objects get measured (their size is only known once
/// the allocating code has filled them in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeMeasurement {
    /// From a postponed job that the NEWOBJ hook asks for: runs at Ruby's
    /// next safe point, costs nothing while no sample is pending.
    PostponedJob,
    /// From a C_RETURN hook, as the C gem does: exact but costly (every
    /// return from a C method pays for the hook).
    CReturn,
}

/// How deaths of sampled objects are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A FREEOBJ hook sees every free in the process as it happens.
    Exact,
    /// No FREEOBJ hook: each tracked sample's object id is checked at a
    /// flush, and whenever enough samples came in (sampler/state/liveness.rs).
    Light,
}

/// Whether `Mode::Light` can run on the Ruby this was built for. It asks
/// for sampled objects' ids and reads `FL_SEEN_OBJ_ID`; Ruby 4.0 keeps the
/// id in the object itself (the first call changes the object's shape and
/// may allocate, and on an internal object it is an `rb_bug`), so from 4.0
/// the mode is refused and the default is `Mode::Exact` (docs/ruby-api.md).
pub const LIGHT_MODE_SUPPORTED: bool = !cfg!(ruby_gte_4_0);

/// `MemprofilerPprof::DEFAULTS[:mode]`.
pub const DEFAULT_MODE: Mode = if LIGHT_MODE_SUPPORTED {
    Mode::Light
} else {
    Mode::Exact
};

/// What lives behind the sampler lock.
pub struct Sampler {
    pub state: SamplerState,
    /// When the NEWOBJ hook is on (sampler/windows.rs).
    pub windows: Windows,
    backtrace: BacktraceBuffer,
    interval_started_at: SystemTime,
}

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

pub struct Collector {
    pub sampler: SamplerLock<Sampler>,
    countdown: SkipCountdown,
    /// Allocations not sampled because the lock was taken; outside the lock
    /// by necessity.
    nolock_drops: AtomicU64,
    /// With windows: allocations since the countdown's event that could not
    /// be handled (lock busy, or this collector's own flush allocating), so
    /// the next one handled knows its position.
    overrun: AtomicU64,
    /// pthread_self() of a thread whose allocations must not be sampled (this
    /// collector's own flush while it calls into Ruby), or 0.
    suppressed_thread: AtomicUsize,
    /// Samples wait to be measured (read by the C_RETURN hook).
    has_pending: AtomicBool,
    /// Ruby's GC count at this collector's last mark (or its creation):
    /// light mode's pending samples are alive only while every GC marks
    /// them (`pending_are_pinned`).
    marked_at_gc: AtomicU32,
    size_measurement: Cell<SizeMeasurement>,
    mode: Cell<Mode>,
    flushing: AtomicBool,
    /// The process whose thread set `flushing` (see `flush`).
    flushing_pid: AtomicU32,
    running: AtomicBool,
    /// Every hook is off while non-main Ractors exist (see `pause_for_ractors`).
    paused_for_ractors: AtomicBool,
    /// Hook or GC-callback failures (caught panics, refused re-entry).
    internal_errors: AtomicU64,
    /// The sampler's filter of tracked addresses, read by the FREEOBJ hook
    /// without the lock.
    free_filter: Arc<AddressFilter>,
    newobj: Hook,
    freeobj: Hook,
    creturn: Hook,
    /// Sampling windows are in use while sampling: each GC's mark
    /// callback then asks for the job that throws the next window's coin.
    /// (Not a GC event hook: any of those makes every allocation take
    /// Ruby's slow path, which is the cost windows are there to avoid.)
    windows_active: AtomicBool,
}

impl Collector {
    pub fn new() -> Self {
        let seed = entropy_seed(0);
        let state = SamplerState::new(
            GapSampler::new(DEFAULT_SAMPLE_RATE, seed),
            DEFAULT_MAX_ALLOCATION_SAMPLES,
            DEFAULT_MAX_HEAP_SAMPLES,
        );
        let free_filter = state.free_filter();
        Collector {
            free_filter,
            sampler: SamplerLock::new(Sampler {
                state,
                windows: {
                    let mut windows = Windows::new(WindowPolicy::Fixed(1.0), window_seed(seed));
                    windows.set_sample_rate(DEFAULT_SAMPLE_RATE);
                    windows
                },
                backtrace: BacktraceBuffer::default(),
                interval_started_at: SystemTime::now(),
            }),
            countdown: SkipCountdown::default(),
            nolock_drops: AtomicU64::new(0),
            overrun: AtomicU64::new(0),
            suppressed_thread: AtomicUsize::new(0),
            has_pending: AtomicBool::new(false),
            // SAFETY: reads a counter (GVL held: collectors are made by
            // Collector.allocate).
            marked_at_gc: AtomicU32::new(unsafe { rb_gc_count() } as u32),
            size_measurement: Cell::new(SizeMeasurement::PostponedJob),
            mode: Cell::new(Mode::Exact),
            flushing: AtomicBool::new(false),
            flushing_pid: AtomicU32::new(0),
            running: AtomicBool::new(false),
            paused_for_ractors: AtomicBool::new(false),
            internal_errors: AtomicU64::new(0),
            newobj: Hook::new(RUBY_INTERNAL_EVENT_NEWOBJ, newobj_hook),
            freeobj: Hook::new(RUBY_INTERNAL_EVENT_FREEOBJ, freeobj_hook),
            creturn: Hook::new(RUBY_EVENT_C_RETURN, c_return_hook),
            windows_active: AtomicBool::new(false),
        }
    }

    /// The sampler, for configuration from Ruby methods (GVL held, not in a
    /// hook, so re-entry cannot happen).
    pub fn with_sampler<R>(&self, f: impl FnOnce(&mut Sampler) -> R) -> RbResult<R> {
        let mut guard = self.sampler.lock().map_err(lock_failure)?;
        Ok(f(&mut guard))
    }

    pub fn set_sample_rate(&self, rate: f64) -> RbResult<()> {
        let gap = self.with_sampler(|s| {
            s.state.gaps.set_rate(rate);
            s.windows.set_sample_rate(rate);
            // (With windows the countdown runs to the next event, and the
            // windows take the rate from their next block.)
            (!s.windows.enabled()).then(|| s.state.gaps.next_gap())
        })?;
        if let Some(gap) = gap {
            self.countdown.set(gap);
        }
        Ok(())
    }

    /// Switches the sizing mechanism, also while running.
    pub fn set_size_measurement(&self, mode: SizeMeasurement) -> RbResult<()> {
        self.size_measurement.set(mode);
        self.measure_pending();
        self.apply_hooks()
    }

    /// Chooses how deaths are found. Only while stopped: samples tracked
    /// one way cannot be checked the other, so they are forgotten.
    pub fn set_mode(&self, mode: Mode) -> RbResult<()> {
        if self.is_running() {
            return Err(RbError::runtime(
                "mode can only be changed while the collector is stopped",
            ));
        }
        if mode == Mode::Light && !LIGHT_MODE_SUPPORTED {
            return Err(RbError::runtime(
                "mode :light is not supported on Ruby 4.0 and later (it reads object ids, which 4.0 \
                 moved into the object); use mode :exact",
            ));
        }
        self.with_sampler(|s| s.state.set_lazy_liveness(mode == Mode::Light))?;
        self.mode.set(mode);
        self.apply_hooks()
    }

    fn is_light(&self) -> bool {
        self.mode.get() == Mode::Light
    }

    /// Sets how sampling windows are chosen: a fixed probability that an
    /// allocation is in one (1.0: the NEWOBJ hook always on), or a budget
    /// of hooked allocations per second. Only while stopped.
    pub fn set_window_policy(&self, policy: WindowPolicy) -> RbResult<()> {
        if self.is_running() {
            return Err(RbError::runtime(
                "sampling windows (window_probability, window_budget) can only be changed while the collector is stopped",
            ));
        }
        self.with_sampler(|s| {
            s.windows = s.windows.renewed(policy, window_seed(s.state.gaps.seed()));
        })
    }

    /// The share of the allocations since the last flush made while the
    /// NEWOBJ hook was on (1.0 without windows), without flushing.
    pub fn window_coverage(&self) -> RbResult<f64> {
        let counter = heap::allocation_counter();
        self.with_sampler(|s| s.windows.coverage_so_far(counter))
    }

    /// Allocations after start during which every sampling window is on.
    /// Only while stopped.
    pub fn set_window_warm_up(&self, allocations: u64) -> RbResult<()> {
        if self.is_running() {
            return Err(RbError::runtime(
                "window_warm_up can only be changed while the collector is stopped",
            ));
        }
        self.with_sampler(|s| s.windows.set_warm_up(allocations))
    }

    pub fn reseed(&self, seed: u64) -> RbResult<()> {
        let gap = self.with_sampler(|s| {
            s.windows = s.windows.renewed(s.windows.policy(), window_seed(seed));
            s.state.reseed(seed);
            s.state.gaps.next_gap()
        })?;
        self.countdown.set(gap);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    pub fn is_paused_for_ractors(&self) -> bool {
        self.paused_for_ractors.load(Ordering::Relaxed)
    }

    fn count_internal_error(&self) {
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn internal_errors(&self) -> u64 {
        self.internal_errors.load(Ordering::Relaxed)
    }

    /// This collector's address as the data of its event hooks, tagged as
    /// a Fixnum (see `Hook`). The collector lives in its TypedData's heap
    /// allocation, so the address is stable.
    fn hook_data(&self) -> VALUE {
        self as *const Collector as VALUE | 1
    }

    // ----- hooks -------------------------------------------------------------

    /// NEWOBJ for an allocation the countdown chose (see `newobj_hook`).
    /// `top_line`: the innermost Ruby frame's line, from the trace arg.
    fn on_sampled_newobj(&self, object: VALUE, top_line: impl FnOnce() -> c_int) {
        let suppressed = self.suppressed_thread.load(Ordering::Relaxed);
        if suppressed != 0 && suppressed == current_thread() {
            // (The countdown stays at 0: the next allocation is this event.)
            self.overrun.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut sampler = match self.sampler.try_lock() {
            Ok(guard) => guard,
            Err(error) => {
                if error == LockError::Reentered {
                    self.count_internal_error();
                }
                self.nolock_drops.fetch_add(1, Ordering::Relaxed);
                self.overrun.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let Sampler {
            state,
            backtrace,
            windows,
            ..
        } = &mut *sampler;
        // With windows the countdown runs to the next event (a sample or a
        // window's end: sampler/windows.rs); without, to the next sample.
        let window = if windows.enabled() {
            let event = windows.on_event(self.overrun.swap(0, Ordering::Relaxed));
            self.countdown.set(event.countdown);
            if event.switch_off {
                registry::request_measurement();
            }
            match event.sample {
                Some(window) => Some(window),
                None => return,
            }
        } else {
            self.countdown.set(state.gaps.next_gap());
            None
        };
        // What the sample costs is measured (sampler/sample_cost.rs).
        let began_ns = window.map(|_| monotonic_ns());
        // A sample in a window also stands for the allocations the windows
        // left out: 1 / (its window's sample rate x probability).
        let weight = match window {
            Some(sampled) => 1.0 / sampled.probability,
            None => state.gaps.weight(),
        };
        let admission = state.admission(weight);
        if admission.is_dropped() {
            // Still forget a sample whose address was reused without a free.
            state.record_free(object as usize);
            return;
        }
        // SAFETY: we are in the NEWOBJ hook for `object`, on a Ruby thread
        // with the GVL.
        let (mut info, frames) = unsafe { (object_info(object), backtrace.capture(top_line)) };
        if let Some(sampled) = window {
            info.set_window(sampled.window, sampled.window_probability);
        }
        state.record_allocation(object as usize, info, frames, admission);
        if let Some(began_ns) = began_ns {
            windows.record_sample_time(monotonic_ns().saturating_sub(began_ns));
        }
        // Measuring costs a postponed job; samples of types that can be
        // sized at their free wait for a batch (a flush measures the rest).
        // In light mode no free is seen and the object is pinned until its
        // job runs, so every sample asks for one.
        let measure_now = self.is_light()
            || state.pending_count() >= MEASURE_BATCH
            || !heap::measurable_at_free(object);
        drop(sampler);
        self.has_pending.store(true, Ordering::Relaxed);
        if measure_now && self.size_measurement.get() == SizeMeasurement::PostponedJob {
            registry::request_measurement();
        }
    }

    #[inline]
    fn on_freeobj(&self, object: VALUE) {
        // Nearly every freed object was never sampled: no lock for those.
        if !self.free_filter.may_contain(object as usize) {
            return;
        }
        match self.sampler.lock() {
            Ok(mut sampler) => {
                // A sample that dies before its measurement ran is sized now.
                sampler
                    .state
                    .record_free_measuring(object as usize, |o| heap::size_at_free(o as VALUE));
            }
            // Only possible if the collector's own locked code triggered a
            // GC, which it is written never to do.
            Err(_) => self.count_internal_error(),
        }
    }

    #[inline]
    fn on_c_return(&self) {
        if self.has_pending.load(Ordering::Relaxed) {
            self.measure_pending();
        }
    }

    /// Sizes newly sampled objects (at a safe point where the allocating code
    /// has filled them in). Holds the lock but calls nothing that allocates.
    /// In light mode, also gives them object ids and looks for dead samples
    /// (`settle_light`).
    pub fn measure_pending(&self) {
        if self.is_light() {
            // (Cleared first: a sample taken meanwhile sets it again. Left
            // set, every C method's return would settle again.)
            self.has_pending.store(false, Ordering::Relaxed);
            if self.settle_light().is_err() {
                self.count_internal_error();
            }
            return;
        }
        if let Ok(mut sampler) = self.sampler.try_lock() {
            self.has_pending.store(false, Ordering::Relaxed);
            sampler
                .state
                .measure_pending(|object| heap::object_size(object as VALUE));
        }
    }

    /// Light mode's upkeep, from the postponed job and before a flush (GVL
    /// held, outside GC). In order:
    /// 1. after GC.compact, finds moved samples again by their ids;
    /// 2. gives new samples their object ids, then measures them (which
    ///    unpins them);
    /// 3. when due, forgets samples whose objects died.
    ///
    /// Ruby is called without the sampler lock (it may allocate, and so GC,
    /// and the GC's mark callback takes the lock).
    fn settle_light(&self) -> RbResult<()> {
        self.settle_light_pruning(false)
    }

    /// Light mode: forgets every sample whose object died, now (a no-op in
    /// exact mode, where the FREEOBJ hook already has).
    pub fn forget_dead_samples(&self) -> RbResult<()> {
        if self.is_light() {
            self.settle_light_pruning(true)?;
        }
        Ok(())
    }

    /// `settle_light`; `prune`: look for dead samples even if not due.
    fn settle_light_pruning(&self, prune: bool) -> RbResult<()> {
        let began_ns = monotonic_ns();
        let settled = self.settle_light_steps(prune)?;
        if settled > 0 {
            // What new samples' upkeep costs counts against their share of
            // the time (sampler/sample_cost.rs).
            let ns = monotonic_ns().saturating_sub(began_ns);
            self.with_sampler(|s| s.windows.record_upkeep_time(ns, settled))?;
        }
        Ok(())
    }

    /// `settle_light_pruning`'s steps; returns how many new samples it
    /// gave ids and measured.
    fn settle_light_steps(&self, prune: bool) -> RbResult<usize> {
        // Once Ractors exist, nothing is tracked (pause_for_ractors), and
        // walking the heap is unsafe: another Ractor may be allocating from
        // the pages being swept (this corrupted malloc's heap in half the
        // runs of the Ractor spec).
        if self.is_paused_for_ractors() {
            return Ok(0);
        }
        if !self.pending_are_pinned() {
            self.with_sampler(|s| s.state.forget_pending())?;
        }
        let (unresolved, epoch) =
            self.with_sampler(|s| (s.state.unresolved(), s.state.compactions()))?;
        if !unresolved.is_empty() {
            // One walk over the heap finds them all (heap::find_objects_by_id).
            let ids = unresolved
                .iter()
                .map(|&(id, object_id)| (object_id, id.index()))
                .collect();
            let found = heap::find_objects_by_id(&ids)?;
            let placed: Vec<_> = unresolved
                .iter()
                .map(|&(id, _)| (id, found.get(&id.index()).copied()))
                .collect();
            // (Nothing in the walk allocates, so no compaction can have run
            // meanwhile; the epoch check keeps that true if it ever does.)
            self.with_sampler(|s| {
                if s.state.compactions() == epoch {
                    s.state.resolve(&placed);
                }
            })?;
        }
        let pending = self.with_sampler(|s| s.state.pending_without_id())?;
        let mut ids = Vec::with_capacity(pending.len());
        let mut gone = Vec::new();
        let mut pinned = true;
        for (id, object) in pending {
            // rb_obj_id may allocate, and so run a GC: if that GC finished
            // marking without this collector (garbage, dropped while
            // running), the rest may be freed and even their slots reused.
            // Nothing of such a collector will be read again, so everything
            // pending goes unread and unmeasured.
            if !self.pending_are_pinned() {
                pinned = false;
                break;
            }
            // Pinned by the mark, so alive. A dead one would mean a path
            // that left it unmarked: counted (the torture fails on it) and
            // never asked for an id (see forget_pending).
            if !heap::is_live_object(object as VALUE) {
                self.count_internal_error();
                gone.push(object);
                continue;
            }
            ids.push((id, object, heap::object_id(object as VALUE)?));
        }
        // (The last rb_obj_id may have run such a GC too; measuring reads
        // the objects. Nothing below allocates.)
        let pinned = pinned && self.pending_are_pinned();
        let settled = if pinned { ids.len() } else { 0 };
        // SAFETY: reads a counter.
        let gc_count = unsafe { rb_gc_count() } as u32;
        let prune_due = self.with_sampler(|s| {
            if pinned {
                for &object in &gone {
                    s.state.record_free(object);
                }
                s.state.assign_object_ids(&ids);
                s.state
                    .measure_pending(|object| heap::object_size(object as VALUE));
            } else {
                s.state.forget_pending();
            }
            s.state.prune_due(gc_count)
        })?;
        if prune || prune_due {
            // No Ruby allocation between listing the pages and the checks,
            // so no GC can free a page in between. (Listing them finishes a
            // lazy sweep, which runs no GC: the count stays.)
            let pages = heap::HeapPages::now()?;
            self.with_sampler(|s| {
                s.state.forget_dead(gc_count, |object, object_id| {
                    heap::is_same_object(&pages, object, object_id)
                })
            })?;
        }
        Ok(settled)
    }

    /// Whether light mode's pending samples are still held by this
    /// collector's mark: false once a GC has finished marking without
    /// calling it. That happens to a collector dropped while running: it is
    /// garbage, but its hooks and jobs run until its deferred free, while
    /// its pending objects are freed, their slots reused, their pages
    /// returned. (An incremental GC lets Ruby run between marking steps:
    /// until its marking ends, what the previous GC's mark held is still
    /// alive; not what an earlier one held, which the previous GC may have
    /// swept.)
    fn pending_are_pinned(&self) -> bool {
        // SAFETY: reads a counter (incremented as each GC starts).
        let now = unsafe { rb_gc_count() } as u32;
        let marked = self.marked_at_gc.load(Ordering::Relaxed);
        marked == now || (marked == now.wrapping_sub(1) && heap::gc_is_marking())
    }

    /// With sampling windows (postponed job, woken by the windows' timer
    /// thread, a GC or the hook): polls the windows, switches the NEWOBJ
    /// hook to match, and says when to poll next.
    fn next_window(&self) {
        // (The job runs for every batch of samples too: nothing to do there
        // without windows.)
        if !self.windows_active.load(Ordering::Relaxed) || self.is_paused_for_ractors() {
            return;
        }
        let counter = heap::allocation_counter();
        let polled = self.with_sampler(|s| {
            let poll = s.windows.poll(counter, monotonic_ns());
            if let Some(countdown) = poll.countdown {
                // Armed: the countdown runs from the next allocation.
                self.countdown.set(countdown);
                self.overrun.store(0, Ordering::Relaxed);
            }
            poll
        });
        match polled {
            Ok(poll) => {
                window_timer::schedule(poll.next_poll_in_ns, registry::request_measurement);
                if self.newobj.is_enabled() != poll.hook_on && self.apply_hooks().is_err() {
                    self.count_internal_error();
                }
            }
            Err(_) => self.count_internal_error(),
        }
    }

    // ----- start / stop ------------------------------------------------------

    /// Returns false if already running. `paused_for_ractors`: start with
    /// the hooks paused because non-main Ractors exist.
    pub fn start(&self, paused_for_ractors: bool) -> RbResult<bool> {
        if self.is_running() {
            return Ok(false);
        }
        let counter = heap::allocation_counter();
        let (gap, poll) = self.with_sampler(|s| {
            s.state.clear();
            let poll = s.windows.start(counter, monotonic_ns());
            s.interval_started_at = SystemTime::now();
            (s.state.gaps.next_gap(), poll)
        })?;
        // With windows the first poll sets the countdown (if it armed).
        self.countdown.set(poll.countdown.unwrap_or(gap));
        self.overrun.store(0, Ordering::Relaxed);
        self.nolock_drops.store(0, Ordering::Relaxed);
        self.paused_for_ractors
            .store(paused_for_ractors, Ordering::Relaxed);
        self.running.store(true, Ordering::Relaxed);
        if let Err(error) = self.apply_hooks() {
            self.running.store(false, Ordering::Relaxed);
            let _ = self.apply_hooks();
            return Err(error);
        }
        if self.windows_active.load(Ordering::Relaxed) {
            window_timer::schedule(poll.next_poll_in_ns, registry::request_measurement);
        }
        Ok(true)
    }

    /// Returns false if it was not running. Samples stay readable; the FREEOBJ
    /// hook stays on while live samples remain, so they stay truthful (a
    /// later flush switches it off once none are left).
    pub fn stop(&self) -> RbResult<bool> {
        if !self.is_running() {
            return Ok(false);
        }
        self.running.store(false, Ordering::Relaxed);
        // Size what was sampled just before stopping, while it is alive.
        self.measure_pending();
        self.freeze_windows();
        self.apply_hooks()?;
        Ok(true)
    }

    /// Sets every tracepoint to what the collector's state calls for:
    /// NEWOBJ (and C_RETURN, if chosen) while running; FREEOBJ while running
    /// or while live samples remain; nothing while paused for Ractors.
    /// Sampling hooks go off before FREEOBJ and on after it, so no sample is
    /// ever recorded without its free being tracked.
    fn apply_hooks(&self) -> RbResult<()> {
        let running = self.is_running();
        let paused = self.is_paused_for_ractors();
        // One hold of the lock for everything the hooks depend on.
        let (live, windows, window_on) =
            self.with_sampler(|s| (s.state.live_count(), s.windows.enabled(), s.windows.is_on()))?;
        let tracking = running || live > 0;
        let sample = running && !paused;
        let c_return = sample && self.size_measurement.get() == SizeMeasurement::CReturn;
        let data = self.hook_data();
        let sample_now = sample && window_on;
        if !sample_now {
            self.newobj.set(false, data)?;
        }
        self.windows_active
            .store(sample && windows, Ordering::Relaxed);
        self.creturn.set(c_return, data)?;
        let watch_frees = tracking && !paused && !self.is_light();
        self.freeobj.set(watch_frees, data)?;
        if sample_now {
            self.newobj.set(true, data)?;
        }
        if tracking {
            registry::add(self);
        } else {
            registry::remove(self);
        }
        Ok(())
    }

    /// Ruby's GC event hooks are not safe while non-main Ractors run: on
    /// Ruby 3.1 a GC or allocation in a Ractor's thread crashes inside the
    /// interpreter whenever any NEWOBJ or FREEOBJ hook is enabled, with or
    /// without this gem's code running (ObjectSpace's allocation tracing
    /// crashes the same way), and even after `Ractor.count` is back to 1 a
    /// finished Ractor's thread can still be allocating on its way out. They
    /// are per-Ractor anyway. So once a process creates a Ractor, every hook
    /// stays off for good; data collected before stays flushable.
    pub fn pause_for_ractors(&self) {
        if self.is_paused_for_ractors() {
            return;
        }
        // Frees will not be seen any more, so tracked addresses would go
        // stale: size what is pending, then stop tracking live objects.
        self.measure_pending();
        match self.sampler.lock() {
            Ok(mut sampler) => sampler.state.stop_tracking_live(),
            Err(_) => self.count_internal_error(),
        }
        self.freeze_windows();
        self.paused_for_ractors.store(true, Ordering::Relaxed);
        if self.apply_hooks().is_err() {
            self.count_internal_error();
        }
    }

    /// Sampling has stopped: a later flush must not scale its samples by
    /// allocations made since (sampler/windows.rs).
    fn freeze_windows(&self) {
        let counter = heap::allocation_counter();
        if self.with_sampler(|s| s.windows.freeze(counter)).is_err() {
            self.count_internal_error();
        }
    }

    /// At interpreter exit: hooks off, without raising (nothing could catch it).
    pub fn disable_hooks_at_exit(&self) {
        self.running.store(false, Ordering::Relaxed);
        let data = self.hook_data();
        for hook in [&self.newobj, &self.creturn, &self.freeobj] {
            let _ = hook.set(false, data);
        }
        registry::remove(self);
    }

    // ----- flush -------------------------------------------------------------

    pub fn flush(&self, options: FlushOptions) -> RbResult<FlushResult> {
        let pid = std::process::id();
        if self.flushing.swap(true, Ordering::Acquire) {
            if self.flushing_pid.load(Ordering::Relaxed) == pid {
                return Err(RbError::runtime(
                    "flush is already in progress on this collector (flush called from within a flush?)",
                ));
            }
            // Inherited from a parent that forked while another of its
            // threads was flushing: that flush will never end here. (The
            // fork handler resets only the collectors it knows are active.)
            self.end_flush();
            self.flushing.store(true, Ordering::Release);
        }
        self.flushing_pid.store(pid, Ordering::Relaxed);
        let result = {
            // Resets the flush state however flush_inner ends (even by panic).
            let _end = FlushEnd(self);
            self.flush_inner(options)
        };
        if result.is_ok() {
            // FREEOBJ off once a stopped collector has no live samples left.
            self.apply_hooks()?;
        }
        result
    }

    /// Ends a flush: no thread is suppressed any more, stacks and classes no
    /// sample uses are forgotten, and the next flush may start.
    fn end_flush(&self) {
        self.suppressed_thread.store(0, Ordering::Relaxed);
        if let Ok(mut sampler) = self.sampler.lock() {
            // A no-op after flush_inner's finish_flush; otherwise ends the
            // flush where it stopped.
            sampler.state.end_flush();
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
            self.end_flush();
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

    fn flush_inner(&self, options: FlushOptions) -> RbResult<FlushResult> {
        let began = Instant::now();
        let mut holds = GvlHolds::new();
        let finished_at = SystemTime::now();
        // 1. Under the lock, with no Ruby allocation: read the samples out.
        //    Allocations from here on belong to the next flush. Live objects
        //    are measured in chunks, with the lock released and (when asked)
        //    other threads let run in between, so that a flush of a large
        //    heap never holds the GVL for long.
        let light = self.is_light();
        let mut measure = |object: usize| heap::object_size(object as VALUE);
        if light {
            self.settle_light()?;
        }
        // SAFETY: reads a counter; no allocation, no raise.
        let gc_count = unsafe { rb_gc_count() } as u32;
        // The steps and their order: sampler/state/flush.rs. On an error (the
        // thread killed while it let others run), the FlushEnd guard's
        // end_flush releases what the flush holds.
        let (measuring, sample_rate, started_at) = self.with_sampler(|s| {
            s.state.measure_pending(measure);
            let started_at = std::mem::replace(&mut s.interval_started_at, finished_at);
            (s.state.begin_flush(), s.state.gaps.rate(), started_at)
        })?;
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
                    .measure_live(&measuring, gc_count, LIVE_CHUNK, &mut measure)
            })?;
            if done {
                break;
            }
            if options.proactively_yield_gvl {
                holds.yield_now()?;
            }
        }
        // An allocation sample still unmeasured is sized here, if its
        // object's free is watched (not in light mode: its address could be
        // stale).
        let mut measure_unmeasured = |object: usize| {
            if light {
                None
            } else {
                heap::object_size(object as VALUE)
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
        snapshot.drops.nolock += self.nolock_drops.swap(0, Ordering::Relaxed);
        // Sampling windows: samples already weigh 1 / their window's
        // probability (sampler/windows.rs); nothing is rescaled here.
        let counter = heap::allocation_counter();
        let (window_flush, window_policy, warm_up, window_length) = self.with_sampler(|s| {
            (
                s.windows.flush(counter),
                s.windows.policy(),
                s.windows.warm_up(),
                s.windows.window_length(),
            )
        })?;
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
        let mut frames = std::mem::take(&mut snapshot.resolved_frames);
        frames.extend(ruby_frames.iter().map(|(&f, info)| (f, info.clone())));
        let mut class_names = std::mem::take(&mut snapshot.resolved_classes);
        class_names.extend(ruby_classes.iter().map(|(&c, name)| (c, name.clone())));
        self.suppressed_thread.store(0, Ordering::Relaxed);

        // 3. Pure Rust: build and compress the profile, without the GVL if
        //    asked.
        let serialization_began = Instant::now();
        let meta = ProfileMeta {
            time_nanos: unix_nanos(finished_at),
            duration_nanos: finished_at
                .duration_since(started_at)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            sample_rate,
            program: program_path(),
            comments: {
                let mut comments = Vec::new();
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
                            "; the block under way has not reached its window: {:.1}% of this                              interval's allocations ({:.1}% since start) are not counted yet, and                              its window's samples will stand for them (counted in the errors)",
                            window_flush.unwindowed_share * 100.0,
                            window_flush.inuse_unwindowed_share * 100.0
                        ));
                    }
                    comments.push(format!(
                        "sampling windows: {window_length}-allocation windows at random places, \
                         {chosen}{warm_up}; {} windows, in which the hook saw {:.2}% of this \
                         interval's allocations; each sample weighs 1 / (its window's sample rate \
                         x probability){missed}",
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
        self.with_sampler(|s| s.state.finish_flush(detaching))?;
        self.in_chunks(&options, &mut holds, |s| s.state.prune_unused(PRUNE_CHUNK))?;
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

    // ----- GC callbacks --------------------------------------------------------

    /// Marks every frame a stored stack refers to (pinned: they are also
    /// held as raw handles inside the stack table). Runs in every GC, minor
    /// ones included (the collector's TypedData is not write-barrier
    /// protected, so Ruby re-marks it each time), which makes it the GC
    /// tick of sampling windows.
    pub fn mark(&self) {
        if self.windows_active.load(Ordering::Relaxed) {
            // Allocation-free and async-signal-safe: the job throws the next
            // window's coin outside GC and outside any hook.
            registry::request_measurement();
        }
        // SAFETY: reads a counter (this GC's, counted at its start).
        let gc_count = unsafe { rb_gc_count() } as u32;
        match self.sampler.lock() {
            Ok(mut sampler) => {
                // Light mode: if a whole GC went by without this mark (only
                // after a failed lock, counted below), the pending objects
                // may be freed slots: never mark them, forget them.
                let marked = self.marked_at_gc.load(Ordering::Relaxed);
                let missed = marked != gc_count && marked != gc_count.wrapping_sub(1);
                if self.is_light() && missed {
                    sampler.state.forget_pending();
                }
                for frame in sampler.state.stacks().live_frames() {
                    // SAFETY: called from the dmark callback, during GC marking.
                    unsafe { rb_gc_mark(frame as VALUE) };
                }
                // Classes too (an anonymous class may have no other owner).
                for class in sampler.state.held_classes().filter(|&c| is_class_value(c)) {
                    // SAFETY: as above.
                    unsafe { rb_gc_mark(class as VALUE) };
                }
                // Light mode: samples waiting for their id stay alive and in
                // place until the postponed job (sampler/state/liveness.rs).
                if self.is_light() {
                    for object in sampler.state.pending_objects() {
                        // SAFETY: as above; each is an object a NEWOBJ hook
                        // received and this mark has kept alive since.
                        unsafe { rb_gc_mark(object as VALUE) };
                    }
                }
                self.marked_at_gc.store(gc_count, Ordering::Relaxed);
            }
            Err(_) => self.count_internal_error(),
        }
    }

    /// After GC.compact: sampled objects may have moved.
    pub fn update_references(&self) {
        if self.is_light() {
            // Tracked addresses may be stale slots on freed pages, so none is
            // read here; the postponed job finds the objects by id.
            // SAFETY: reads a counter.
            let gc_count = unsafe { rb_gc_count() } as u32;
            match self.sampler.lock() {
                Ok(mut sampler) => sampler.state.forget_addresses(gc_count, |object| {
                    // SAFETY: called from dcompact, only for addresses
                    // whose page is still there (see forget_addresses).
                    unsafe { rb_gc_location(object as VALUE) as usize }
                }),
                Err(_) => self.count_internal_error(),
            }
            registry::request_measurement();
            return;
        }
        match self.sampler.lock() {
            Ok(mut sampler) => sampler.state.relocate_objects(|object| {
                // SAFETY: called from dcompact; every tracked address is a live
                // object or its forwarding (T_MOVED) slot.
                unsafe { rb_gc_location(object as VALUE) as usize }
            }),
            Err(_) => self.count_internal_error(),
        }
    }

    pub fn memory_bytes(&self) -> usize {
        let state = self
            .sampler
            .lock()
            .map(|s| s.state.memory_bytes())
            .unwrap_or(0);
        std::mem::size_of::<Self>() + state + BacktraceBuffer::memory_bytes()
    }
}

impl Registered for Collector {
    fn measure_pending(&self) {
        self.next_window();
        Collector::measure_pending(self);
    }

    fn disable_hooks_at_exit(&self) {
        Collector::disable_hooks_at_exit(self);
    }

    fn pause_for_ractors(&self) {
        Collector::pause_for_ractors(self);
    }

    fn lock_for_fork(&self) {
        self.sampler.lock_for_fork();
    }

    fn unlock_after_fork(&self) {
        self.sampler.unlock_after_fork();
    }

    fn reinit_lock_in_child(&self) {
        self.sampler.reinit_in_child();
    }

    fn reset_after_fork_in_child(&self) {
        Collector::reset_after_fork_in_child(self);
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // Hooks off before the memory they point at goes away. Runs from the
        // deferred free (GVL held, outside GC), so Ruby calls are allowed.
        registry::remove(self);
        let data = self.hook_data();
        for hook in [&self.newobj, &self.creturn, &self.freeobj] {
            let _ = hook.set(false, data);
        }
    }
}

struct FlushEnd<'a>(&'a Collector);

impl Drop for FlushEnd<'_> {
    fn drop(&mut self) {
        self.0.end_flush();
    }
}

/// The seed of the windows' coin: derived from the sampler's, so one
/// `seed:` makes the whole run reproducible, windows included.
fn window_seed(seed: u64) -> u64 {
    seed.wrapping_add(2)
}

fn lock_failure(error: LockError) -> RbError {
    RbError::runtime(format!(
        "memprofiler_pprof_rs internal error: sampler lock unavailable ({error:?})"
    ))
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

/// Runs a hook's body for the collector tagged in `data`; a panic is
/// counted, never unwound into Ruby. Hooks never raise, never allocate a
/// Ruby object and never release the GVL.
#[inline(always)]
fn in_hook(data: VALUE, body: impl FnOnce(&Collector)) {
    // SAFETY: `data` is `hook_data()` of a collector that removes its hooks
    // before it is dropped.
    let collector = unsafe { &*((data & !1) as *const Collector) };
    if catch_unwind(AssertUnwindSafe(|| body(collector))).is_err() {
        collector.count_internal_error();
    }
}

unsafe extern "C" fn newobj_hook(data: VALUE, arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| {
        // The common case, first and cheapest: not this allocation.
        if collector.countdown.skip() {
            return;
        }
        // SAFETY (both): a NEWOBJ trace arg carries the new object, and the
        // frame it was allocated in, whose line rb_tracearg_lineno reads
        // from the frame's pc, returning a Fixnum, without allocating
        // (ObjectSpace's allocation tracing calls it from this same hook).
        collector.on_sampled_newobj(unsafe { rb_tracearg_object(arg) }, || {
            fixnum(unsafe { rb_tracearg_lineno(arg) }).map_or(0, |line| line as c_int)
        });
    });
}

unsafe extern "C" fn freeobj_hook(data: VALUE, arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| {
        // SAFETY: a FREEOBJ trace arg carries the object being freed.
        collector.on_freeobj(unsafe { rb_tracearg_object(arg) });
    });
}

unsafe extern "C" fn c_return_hook(data: VALUE, _arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| collector.on_c_return());
}
