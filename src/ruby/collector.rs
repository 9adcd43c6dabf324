//! The collector behind a `MemprofilerPprof::Collector` object: the sampler
//! state under its lock, the two tracepoints, and what the hooks and
//! `flush` do with them.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rb_sys::{
    rb_event_flag_t, rb_gc_location, rb_gc_mark, rb_gc_register_address, rb_gc_unregister_address,
    rb_tracearg_event_flag, rb_tracearg_from_tracepoint, rb_tracearg_object, rb_tracepoint_disable,
    rb_tracepoint_enable, rb_tracepoint_new, Qfalse, Qnil, RUBY_INTERNAL_EVENT_FREEOBJ,
    RUBY_INTERNAL_EVENT_NEWOBJ, VALUE,
};

use super::active_collectors;
use super::errors::{protect, RbError, RbResult};
use super::frames::{resolve_frames, BacktraceBuffer};
use super::heap;
use crate::core::lock::{LockError, SamplerLock};
use crate::core::profile_builder::{build_profile, encode_gzipped, ProfileMeta};
use crate::core::sample_gate::{entropy_seed, GapSampler, SkipCountdown};
use crate::core::sampler_state::{Admission, DropCounters, SamplerState};

pub const DEFAULT_SAMPLE_RATE: f64 = 0.01;
pub const DEFAULT_MAX_ALLOCATION_SAMPLES: usize = 10_000;
pub const DEFAULT_MAX_HEAP_SAMPLES: usize = 50_000;

/// What lives behind the sampler lock.
pub struct Sampler {
    pub state: SamplerState,
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
}

pub struct Collector {
    pub sampler: SamplerLock<Sampler>,
    countdown: SkipCountdown,
    /// Allocations not sampled because the lock was taken; outside the lock
    /// by necessity.
    nolock_drops: AtomicU64,
    /// Set while this collector's own flush calls into Ruby, so that the
    /// profiler does not sample its own allocations.
    suppress_sampling: AtomicBool,
    flushing: AtomicBool,
    running: AtomicBool,
    /// Hook or GC-callback failures (caught panics, refused re-entry).
    internal_errors: AtomicU64,
    // The TracePoint objects, registered as GC roots while they exist so that
    // they outlive the collector's own Ruby object in any sweep order. Boxed:
    // rb_gc_register_address keeps the slot's address.
    newobj_tracepoint: Box<Cell<VALUE>>,
    freeobj_tracepoint: Box<Cell<VALUE>>,
    newobj_enabled: AtomicBool,
    freeobj_enabled: AtomicBool,
}

impl Collector {
    pub fn new() -> Self {
        let seed = entropy_seed(0);
        Collector {
            sampler: SamplerLock::new(Sampler {
                state: SamplerState::new(
                    GapSampler::new(DEFAULT_SAMPLE_RATE, seed),
                    DEFAULT_MAX_ALLOCATION_SAMPLES,
                    DEFAULT_MAX_HEAP_SAMPLES,
                ),
                backtrace: BacktraceBuffer::default(),
                interval_started_at: SystemTime::now(),
            }),
            countdown: SkipCountdown::default(),
            nolock_drops: AtomicU64::new(0),
            suppress_sampling: AtomicBool::new(false),
            flushing: AtomicBool::new(false),
            running: AtomicBool::new(false),
            internal_errors: AtomicU64::new(0),
            newobj_tracepoint: Box::new(Cell::new(Qnil as VALUE)),
            freeobj_tracepoint: Box::new(Cell::new(Qnil as VALUE)),
            newobj_enabled: AtomicBool::new(false),
            freeobj_enabled: AtomicBool::new(false),
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
            s.state.gaps.next_gap()
        })?;
        self.countdown.set(gap);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    fn count_internal_error(&self) {
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn internal_errors(&self) -> u64 {
        self.internal_errors.load(Ordering::Relaxed)
    }

    // ----- hooks -------------------------------------------------------------

    fn on_newobj(&self, object: VALUE) {
        if self.suppress_sampling.load(Ordering::Relaxed) || self.countdown.skip() {
            return;
        }
        let mut sampler = match self.sampler.try_lock() {
            Ok(guard) => guard,
            Err(error) => {
                if error == LockError::Reentered {
                    self.count_internal_error();
                }
                self.nolock_drops.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let Sampler {
            state, backtrace, ..
        } = &mut *sampler;
        self.countdown.set(state.gaps.next_gap());
        let admission = state.admission();
        if admission == Admission::Dropped {
            return;
        }
        let weight = state.gaps.weight();
        // SAFETY: we are in the NEWOBJ hook, on a Ruby thread with the GVL.
        let frames = unsafe { backtrace.capture() };
        state.record_allocation(object as usize, frames, weight, admission);
        drop(sampler);
        active_collectors::request_measurement();
    }

    fn on_freeobj(&self, object: VALUE) {
        match self.sampler.lock() {
            Ok(mut sampler) => {
                sampler.state.record_free(object as usize);
            }
            Err(_) => {
                // Only possible if the collector's own locked code triggered
                // a GC, which it is written never to do.
                self.count_internal_error();
            }
        }
    }

    /// Sizes newly sampled objects (from a postponed job: a safe point where
    /// the allocating code has filled them in). Holds the lock but calls
    /// nothing that allocates.
    pub fn measure_pending(&self) {
        if let Ok(mut sampler) = self.sampler.try_lock() {
            sampler
                .state
                .measure_pending(|object| heap::object_size(object as VALUE));
        }
    }

    // ----- start / stop ------------------------------------------------------

    /// Creates the tracepoints on first use. Allocates Ruby objects, so it
    /// runs outside the lock and under protect.
    fn ensure_tracepoints(&self) -> RbResult<()> {
        let data = self as *const Collector as *mut c_void;
        for (slot, event) in [
            (&self.newobj_tracepoint, RUBY_INTERNAL_EVENT_NEWOBJ),
            (&self.freeobj_tracepoint, RUBY_INTERNAL_EVENT_FREEOBJ),
        ] {
            if slot.get() != Qnil as VALUE {
                continue;
            }
            // SAFETY: the hook function matches the tracepoint callback type;
            // `data` is this collector, which disables the tracepoints before
            // it is dropped (see `Drop`).
            let tracepoint = protect(|| unsafe {
                rb_tracepoint_new(
                    Qfalse as VALUE,
                    event as rb_event_flag_t,
                    Some(tracepoint_hook),
                    data,
                )
            })?;
            slot.set(tracepoint);
            // SAFETY: the slot is boxed and lives until `Drop` unregisters it.
            unsafe { rb_gc_register_address(slot.as_ptr()) };
        }
        Ok(())
    }

    /// Returns false if already running.
    pub fn start(&self) -> RbResult<bool> {
        if self.is_running() {
            return Ok(false);
        }
        self.ensure_tracepoints()?;
        let gap = self.with_sampler(|s| {
            s.state.clear();
            s.interval_started_at = SystemTime::now();
            s.state.gaps.next_gap()
        })?;
        self.countdown.set(gap);
        self.nolock_drops.store(0, Ordering::Relaxed);
        active_collectors::add(self);
        self.set_freeobj_hook(true)?;
        self.set_newobj_hook(true)?;
        self.running.store(true, Ordering::Relaxed);
        Ok(true)
    }

    /// Returns false if it was not running. Samples stay readable; the FREEOBJ
    /// hook stays on while live samples remain, so they stay truthful (a
    /// later flush switches it off once none are left).
    pub fn stop(&self) -> RbResult<bool> {
        if !self.is_running() {
            return Ok(false);
        }
        self.set_newobj_hook(false)?;
        self.running.store(false, Ordering::Relaxed);
        // Size what was sampled just before stopping, while it is alive.
        self.measure_pending();
        self.release_freeobj_hook_if_idle()?;
        Ok(true)
    }

    fn release_freeobj_hook_if_idle(&self) -> RbResult<()> {
        if self.is_running() {
            return Ok(());
        }
        let live = self.with_sampler(|s| s.state.live_count())?;
        if live == 0 {
            self.set_freeobj_hook(false)?;
            active_collectors::remove(self);
        }
        Ok(())
    }

    fn set_newobj_hook(&self, on: bool) -> RbResult<()> {
        set_tracepoint(self.newobj_tracepoint.get(), &self.newobj_enabled, on)
    }

    fn set_freeobj_hook(&self, on: bool) -> RbResult<()> {
        set_tracepoint(self.freeobj_tracepoint.get(), &self.freeobj_enabled, on)
    }

    /// At interpreter exit: hooks off, without raising (nothing could catch it).
    pub fn disable_hooks_at_exit(&self) {
        let _ = self.set_newobj_hook(false);
        let _ = self.set_freeobj_hook(false);
        self.running.store(false, Ordering::Relaxed);
        active_collectors::remove(self);
    }

    // ----- flush -------------------------------------------------------------

    pub fn flush(&self) -> RbResult<FlushResult> {
        if self.flushing.swap(true, Ordering::Acquire) {
            return Err(RbError::runtime(
                "flush is already in progress on this collector (flush called from within a flush?)",
            ));
        }
        let result = self.flush_inner();
        self.suppress_sampling.store(false, Ordering::Relaxed);
        // Whatever happened, forget stacks that no sample uses any more.
        if let Ok(mut sampler) = self.sampler.lock() {
            sampler.state.finish_flush();
        }
        self.flushing.store(false, Ordering::Release);
        if result.is_ok() {
            self.release_freeobj_hook_if_idle()?;
        }
        result
    }

    fn flush_inner(&self) -> RbResult<FlushResult> {
        let began = Instant::now();
        let finished_at = SystemTime::now();
        // 1. Under the lock, with no Ruby allocation: read the samples out.
        let (mut snapshot, sample_rate, started_at) = self.with_sampler(|s| {
            let measure = |object: usize| heap::object_size(object as VALUE);
            s.state.measure_pending(measure);
            let snapshot = s.state.take_snapshot(measure);
            let started_at = std::mem::replace(&mut s.interval_started_at, finished_at);
            (snapshot, s.state.gaps.rate(), started_at)
        })?;
        snapshot.drops.nolock += self.nolock_drops.swap(0, Ordering::Relaxed);

        // 2. Without the lock: name the frames (allocates Ruby strings; the
        //    frames stay marked until `finish_flush` prunes them).
        self.suppress_sampling.store(true, Ordering::Relaxed);
        let frames = resolve_frames(&snapshot.stacks)?;
        self.suppress_sampling.store(false, Ordering::Relaxed);

        // 3. Pure Rust: build and compress the profile.
        let serialization_began = Instant::now();
        let meta = ProfileMeta {
            time_nanos: unix_nanos(finished_at),
            duration_nanos: finished_at
                .duration_since(started_at)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            sample_rate,
            program: program_path(),
            comments: if heap::can_measure_sizes() {
                Vec::new()
            } else {
                vec!["object sizes unavailable on this Ruby (no rb_obj_memsize_of)".into()]
            },
        };
        let profile = build_profile(&snapshot, &frames, &meta);
        let pprof = encode_gzipped(&profile);
        Ok(FlushResult {
            pprof,
            allocation_samples: snapshot.allocation_samples,
            heap_samples: snapshot.heap_samples,
            drops: snapshot.drops,
            sample_rate,
            started_at,
            finished_at,
            flush_duration_nanos: began.elapsed().as_nanos() as u64,
            serialization_nanos: serialization_began.elapsed().as_nanos() as u64,
        })
    }

    // ----- GC callbacks --------------------------------------------------------

    /// Marks every frame a stored stack refers to (pinned: they are also
    /// held as raw handles inside the stack table).
    pub fn mark(&self) {
        let mark_frames = |sampler: &Sampler| {
            for frame in sampler.state.stacks().live_frames() {
                // SAFETY: called from the dmark callback, during GC marking.
                unsafe { rb_gc_mark(frame as VALUE) };
            }
        };
        match self.sampler.lock() {
            Ok(sampler) => mark_frames(&sampler),
            Err(_) => self.count_internal_error(),
        }
    }

    /// After GC.compact: sampled objects may have moved.
    pub fn update_references(&self) {
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
        std::mem::size_of::<Self>() + state + (super::frames::MAX_FRAMES + 1) * 16
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // Hooks off before the memory they point at goes away. Runs from the
        // deferred free (GVL held, outside GC), so Ruby calls are allowed; the
        // TracePoint objects are GC roots, hence still valid here.
        active_collectors::remove(self);
        let _ = self.set_newobj_hook(false);
        let _ = self.set_freeobj_hook(false);
        for slot in [&self.newobj_tracepoint, &self.freeobj_tracepoint] {
            if slot.get() != Qnil as VALUE {
                // SAFETY: registered in `ensure_tracepoints`.
                unsafe { rb_gc_unregister_address(slot.as_ptr()) };
            }
        }
    }
}

fn set_tracepoint(tracepoint: VALUE, enabled: &AtomicBool, on: bool) -> RbResult<()> {
    if tracepoint == Qnil as VALUE || enabled.load(Ordering::Relaxed) == on {
        return Ok(());
    }
    protect(|| {
        // SAFETY: `tracepoint` is a live TracePoint (a registered GC root).
        unsafe {
            if on {
                rb_tracepoint_enable(tracepoint)
            } else {
                rb_tracepoint_disable(tracepoint)
            }
        }
    })?;
    enabled.store(on, Ordering::Relaxed);
    Ok(())
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

/// The single callback of both tracepoints. Never raises, never allocates a
/// Ruby object, never releases the GVL.
unsafe extern "C" fn tracepoint_hook(tracepoint: VALUE, data: *mut c_void) {
    // SAFETY: `data` is the collector that created this tracepoint; it
    // disables the tracepoint before being dropped.
    let collector = unsafe { &*(data as *const Collector) };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: inside a tracepoint callback the trace arg is available;
        // these accessors only read it.
        let (event, object) = unsafe {
            let arg = rb_tracearg_from_tracepoint(tracepoint);
            (rb_tracearg_event_flag(arg), rb_tracearg_object(arg))
        };
        if event & RUBY_INTERNAL_EVENT_NEWOBJ as rb_event_flag_t != 0 {
            collector.on_newobj(object);
        } else if event & RUBY_INTERNAL_EVENT_FREEOBJ as rb_event_flag_t != 0 {
            collector.on_freeobj(object);
        }
    }));
    if outcome.is_err() {
        collector.count_internal_error();
    }
}
