//! The collector behind a `MemprofilerPprof::Collector` object: its
//! settings, the sampler state under its lock, and starting and stopping
//! its hooks (GVL held, outside GC). The rest, each file saying when its
//! functions run and what they may not do:
//!
//! - `sampling`: the event hooks' bodies and the postponed job;
//! - `light_upkeep`: `mode: :light`'s object ids and dead samples;
//! - `flush`: a flush in chunks, letting other threads run in between;
//! - `live_sites`: the live objects by stack, for a retention report;
//! - `gc_callbacks`: mark, compaction and memory size, inside GC.

mod flush;
mod gc_callbacks;
mod light_upkeep;
mod live_sites;
mod sampling;

pub use flush::{FlushOptions, FlushResult};
pub use live_sites::LiveSite;
use sampling::{c_return_hook, freeobj_hook, newobj_hook};

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use rb_sys::{
    rb_gc_count, RUBY_EVENT_C_RETURN, RUBY_INTERNAL_EVENT_FREEOBJ, RUBY_INTERNAL_EVENT_NEWOBJ,
    VALUE,
};

use super::errors::{RbError, RbResult};
use super::frames::BacktraceBuffer;
use super::heap;
use super::hooks::Hook;
use super::registry::{self, Registered};
use super::window_timer;
use sampler::address_filter::AddressFilter;
use sampler::gaps::{entropy_seed, GapSampler, SkipCountdown};
use sampler::state::SamplerState;
use sampler::windows::{WindowPolicy, Windows};
use sampler_lock::{LockError, SamplerLock};

pub const DEFAULT_SAMPLE_RATE: f64 = 0.01;
pub const DEFAULT_MAX_ALLOCATION_SAMPLES: usize = 10_000;
pub const DEFAULT_MAX_HEAP_SAMPLES: usize = 50_000;
/// Collector.new's sampling windows (with `mode: :light`, below 1.0): at
/// most about this many hooked allocations a second, about 3,000 a window
/// (its 1,000, the lead, and the ~2,000 before it where polls stop: one
/// more would cost more than the allocations it saves hooking). At the
/// 80-300 ns a hooked allocation costs (bench/run callgrind alloc, deep;
/// the Rails-depth app at 165 frames), that is 0.8-3% of a core.
pub const DEFAULT_WINDOW_BUDGET: u64 = 100_000;
/// .. after every allocation is hooked for this many: a fraction of a
/// second of a busy server, and all of most short profiles (a block, a
/// test, a script), which are then complete at the sample rate. Why not
/// more: a loop that allocates from start pays the whole hook for this
/// share of itself (docs/performance.md, "The defaults").
pub const DEFAULT_WINDOW_WARM_UP: u64 = 250_000;

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
    /// When the NEWOBJ hook is on (sampler/windows/mod.rs).
    pub windows: Windows,
    backtrace: BacktraceBuffer,
    interval_started_at: SystemTime,
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
    /// inuse_* counts every live sample at the flush (true), or only those
    /// alive at the last completed GC (false, the default).
    inuse_at_flush: Cell<bool>,
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
            inuse_at_flush: Cell::new(false),
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
            return Err(RbError::state(
                "mode can only be changed while the collector is stopped",
            ));
        }
        if mode == Mode::Light && !LIGHT_MODE_SUPPORTED {
            return Err(RbError::state(
                "mode :light is not supported on Ruby 4.0 and later (it reads object ids, which 4.0 \
                 moved into the object); use mode :exact",
            ));
        }
        self.with_sampler(|s| s.state.set_lazy_liveness(mode == Mode::Light))?;
        self.mode.set(mode);
        self.apply_hooks()
    }

    /// What inuse_* counts (see the field); also while running.
    pub fn set_inuse_at_flush(&self, at_flush: bool) {
        self.inuse_at_flush.set(at_flush);
    }

    fn is_light(&self) -> bool {
        self.mode.get() == Mode::Light
    }

    /// Sets how sampling windows are chosen: a fixed probability that an
    /// allocation is in one (1.0: the NEWOBJ hook always on), or a budget
    /// of hooked allocations per second. Only while stopped.
    pub fn set_window_policy(&self, policy: WindowPolicy) -> RbResult<()> {
        if self.is_running() {
            return Err(RbError::state(
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
            return Err(RbError::state(
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
            let poll = s.windows.start(counter, window_timer::poll_time());
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
        let (live, windows, window_on, leftovers) = self.with_sampler(|s| {
            (
                s.state.live_count(),
                s.windows.enabled(),
                s.windows.is_on(),
                s.state.has_flush_leftovers(),
            )
        })?;
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
        // (Registered while a flush's leftovers wait for the postponed job.)
        if tracking || leftovers {
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
    /// allocations made since (sampler/windows/mod.rs).
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
}

impl Registered for Collector {
    fn measure_pending(&self) {
        self.next_window();
        Collector::measure_pending(self);
    }

    fn tidy_after_flush(&self) {
        Collector::tidy_after_flush(self);
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

/// The seed of the windows' coin: derived from the sampler's, so one
/// `seed:` makes the whole run reproducible, windows included.
fn window_seed(seed: u64) -> u64 {
    seed.wrapping_add(2)
}

fn lock_failure(error: LockError) -> RbError {
    RbError::internal(format!(
        "memprofiler_pprof_rs internal error: sampler lock unavailable ({error:?})"
    ))
}
