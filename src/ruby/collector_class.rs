//! `MemprofilerPprof::Collector`'s native half: the TypedData wrapper and
//! the private `_native_*` methods that lib/memprofiler_pprof_rs/collector.rb
//! calls after validating arguments. These methods check types again, so a
//! direct call with bad values gets a TypeError, not undefined behaviour.

use std::ffi::{c_long, CStr};

use rb_sys::{
    rb_ary_new_capa, rb_ary_push, rb_float_new, rb_hash_aset, rb_hash_new, rb_id2sym, rb_intern,
    rb_obj_freeze, rb_str_new, rb_ull2inum, rb_utf8_str_new, Qfalse, Qnil, Qtrue, FIX2LONG,
    FIXNUM_P, NIL_P, NUM2DBL, RB_FLOAT_TYPE_P, TEST, VALUE,
};

use super::collector::{Collector, FlushOptions, FlushResult, LiveSite, Mode, SizeMeasurement};
use super::convert::object_value;
use super::heap::GcOff;

/// ProfileData's keys for the spread figures, in FlushResult's order.
const SAMPLE_TYPE_NAMES: [&std::ffi::CStr; 4] = [
    c"alloc_objects",
    c"alloc_space",
    c"inuse_objects",
    c"inuse_space",
];
use super::convert::count_arg;
use super::errors::{method_entry, protect, RbError, RbResult};
use super::method_table::{method_def, MethodDef, MethodKind};
use super::registry;
use super::typed_data::{self, DataType, TypedData};
use pprof::heap_profile::SampleLabels;
use sampler::fast_hash::FastHashMap;
use sampler::stack_table::FrameInfo;
use sampler::types::{FrameRef, TRUNCATION_FRAME};
use sampler::windows::WindowPolicy;

impl TypedData for Collector {
    const NAME: &'static CStr = c"MemprofilerPprof::Collector";
    const NOUN: &'static str = "collector";
    // Not free-immediately on purpose: dropping a collector switches the
    // hooks off, which is only allowed outside GC, in the deferred free.
    const FREE_IMMEDIATELY: bool = false;
    const HOLDS_OBJECTS: bool = true;

    fn memory_bytes(&self) -> usize {
        Collector::memory_bytes(self)
    }

    fn mark(&self) {
        Collector::mark(self);
    }

    fn update_references(&self) {
        Collector::update_references(self);
    }
}

static COLLECTOR_TYPE: DataType<Collector> = DataType::of();

pub unsafe extern "C" fn collector_alloc(klass: VALUE) -> VALUE {
    method_entry(|| typed_data::wrap(klass, Collector::new(), &COLLECTOR_TYPE))
}

fn collector_of(object: VALUE) -> RbResult<&'static Collector> {
    typed_data::get(object, &COLLECTOR_TYPE)
}

fn float_arg(value: VALUE, name: &str) -> RbResult<f64> {
    // SAFETY: type checks read flags only; NUM2DBL on a Float cannot raise.
    if unsafe { RB_FLOAT_TYPE_P(value) } {
        Ok(unsafe { NUM2DBL(value) })
    } else if FIXNUM_P(value) {
        // SAFETY: checked to be a Fixnum.
        Ok(unsafe { FIX2LONG(value) } as f64)
    } else {
        Err(RbError::type_error(format!("{name} must be a Float")))
    }
}

fn fraction_arg(value: VALUE, name: &str) -> RbResult<f64> {
    let rate = float_arg(value, name)?;
    if !(0.0..=1.0).contains(&rate) {
        return Err(RbError::argument(format!(
            "{name} must be between 0.0 and 1.0, got {rate:?}"
        )));
    }
    Ok(rate)
}

fn rate_arg(value: VALUE) -> RbResult<f64> {
    fraction_arg(value, "sample_rate")
}

fn ruby_uint(n: u64) -> RbResult<VALUE> {
    // SAFETY: allocates at most a Bignum; under protect.
    protect(|| unsafe { rb_ull2inum(n) })
}

fn ruby_bool(b: bool) -> VALUE {
    if b {
        Qtrue as VALUE
    } else {
        Qfalse as VALUE
    }
}

unsafe extern "C" fn native_configure(
    rb_self: VALUE,
    sample_rate: VALUE,
    max_allocation_samples: VALUE,
    max_heap_samples: VALUE,
) -> VALUE {
    method_entry(|| {
        let collector = collector_of(rb_self)?;
        let rate = rate_arg(sample_rate)?;
        let max_allocations = count_arg(max_allocation_samples, "max_allocation_samples")?;
        let max_heap = count_arg(max_heap_samples, "max_heap_samples")?;
        collector.set_sample_rate(rate)?;
        collector.with_sampler(|s| {
            s.state.max_allocation_samples = max_allocations;
            s.state.max_heap_samples = max_heap;
        })?;
        Ok(Qnil as VALUE)
    })
}

/// Seeds the sampler's random draws (collector.rb passes `seed:`).
unsafe extern "C" fn native_set_seed(rb_self: VALUE, seed: VALUE) -> VALUE {
    method_entry(|| {
        let seed = count_arg(seed, "seed")? as u64;
        collector_of(rb_self)?.reseed(seed)?;
        Ok(Qnil as VALUE)
    })
}

unsafe extern "C" fn native_set_sample_rate(rb_self: VALUE, sample_rate: VALUE) -> VALUE {
    method_entry(|| {
        let rate = rate_arg(sample_rate)?;
        collector_of(rb_self)?.set_sample_rate(rate)?;
        Ok(sample_rate)
    })
}

unsafe extern "C" fn sample_rate(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let rate = collector_of(rb_self)?.with_sampler(|s| s.state.gaps.rate())?;
        // SAFETY: may allocate a Float; under protect.
        protect(|| unsafe { rb_float_new(rate) })
    })
}

unsafe extern "C" fn native_set_max_allocation_samples(rb_self: VALUE, value: VALUE) -> VALUE {
    method_entry(|| {
        let max = count_arg(value, "max_allocation_samples")?;
        collector_of(rb_self)?.with_sampler(|s| s.state.max_allocation_samples = max)?;
        Ok(value)
    })
}

unsafe extern "C" fn max_allocation_samples(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let max = collector_of(rb_self)?.with_sampler(|s| s.state.max_allocation_samples)?;
        ruby_uint(max as u64)
    })
}

unsafe extern "C" fn native_set_max_heap_samples(rb_self: VALUE, value: VALUE) -> VALUE {
    method_entry(|| {
        let max = count_arg(value, "max_heap_samples")?;
        collector_of(rb_self)?.with_sampler(|s| s.state.max_heap_samples = max)?;
        Ok(value)
    })
}

unsafe extern "C" fn max_heap_samples(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let max = collector_of(rb_self)?.with_sampler(|s| s.state.max_heap_samples)?;
        ruby_uint(max as u64)
    })
}

unsafe extern "C" fn native_set_allocation_retain_rate(rb_self: VALUE, value: VALUE) -> VALUE {
    method_entry(|| {
        let rate = fraction_arg(value, "allocation_retain_rate")?;
        collector_of(rb_self)?.with_sampler(|s| s.state.set_allocation_retain_rate(rate))?;
        Ok(value)
    })
}

unsafe extern "C" fn allocation_retain_rate(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let rate = collector_of(rb_self)?.with_sampler(|s| s.state.allocation_retain_rate())?;
        // SAFETY: may allocate a Float; under protect.
        protect(|| unsafe { rb_float_new(rate) })
    })
}

/// size_measurement as a small integer: 0 = :postponed_job, 1 = :c_return.
unsafe extern "C" fn native_set_size_measurement(rb_self: VALUE, code: VALUE) -> VALUE {
    method_entry(|| {
        let mode = match count_arg(code, "size_measurement code")? {
            0 => SizeMeasurement::PostponedJob,
            1 => SizeMeasurement::CReturn,
            n => {
                return Err(RbError::argument(format!(
                    "unknown size_measurement code {n}"
                )))
            }
        };
        collector_of(rb_self)?.set_size_measurement(mode)?;
        Ok(code)
    })
}

/// inuse_as_of as a small integer: 0 = :last_gc, 1 = :flush.
unsafe extern "C" fn native_set_inuse_as_of(rb_self: VALUE, code: VALUE) -> VALUE {
    method_entry(|| {
        let at_flush = match count_arg(code, "inuse_as_of code")? {
            0 => false,
            1 => true,
            n => return Err(RbError::argument(format!("unknown inuse_as_of code {n}"))),
        };
        collector_of(rb_self)?.set_inuse_at_flush(at_flush);
        Ok(code)
    })
}

unsafe extern "C" fn native_set_window_probability(rb_self: VALUE, probability: VALUE) -> VALUE {
    method_entry(|| {
        let q = fraction_arg(probability, "window_probability")?;
        if q == 0.0 {
            return Err(RbError::argument(
                "window_probability must be above 0.0 (1.0: no sampling windows), got 0.0",
            ));
        }
        collector_of(rb_self)?.set_window_policy(WindowPolicy::Fixed(q))?;
        Ok(probability)
    })
}

/// Sampling windows chosen from a budget of hooked allocations per second.
unsafe extern "C" fn native_set_window_budget(rb_self: VALUE, budget: VALUE) -> VALUE {
    method_entry(|| {
        let per_second = count_arg(budget, "window_budget")?;
        if per_second == 0 {
            return Err(RbError::argument(
                "window_budget must be at least 1 allocation a second (nil: no budget), got 0",
            ));
        }
        collector_of(rb_self)?.set_window_policy(WindowPolicy::Budget(per_second as f64))?;
        Ok(budget)
    })
}

/// Allocations after start during which every window is on.
unsafe extern "C" fn native_set_window_warm_up(rb_self: VALUE, warm_up: VALUE) -> VALUE {
    method_entry(|| {
        let allocations = count_arg(warm_up, "window_warm_up")?;
        collector_of(rb_self)?.set_window_warm_up(allocations as u64)?;
        Ok(warm_up)
    })
}

/// mode as a small integer: 0 = :exact, 1 = :light.
unsafe extern "C" fn native_set_mode(rb_self: VALUE, code: VALUE) -> VALUE {
    method_entry(|| {
        let mode = match count_arg(code, "mode code")? {
            0 => Mode::Exact,
            1 => Mode::Light,
            n => return Err(RbError::argument(format!("unknown mode code {n}"))),
        };
        collector_of(rb_self)?.set_mode(mode)?;
        Ok(code)
    })
}

unsafe extern "C" fn native_start(rb_self: VALUE, paused_for_ractors: VALUE) -> VALUE {
    method_entry(|| {
        Ok(ruby_bool(
            collector_of(rb_self)?.start(TEST(paused_for_ractors))?,
        ))
    })
}

unsafe extern "C" fn sampling_paused_for_ractors_p(rb_self: VALUE) -> VALUE {
    method_entry(|| Ok(ruby_bool(collector_of(rb_self)?.is_paused_for_ractors())))
}

/// Collector._native_pause_all_for_ractors: called just before a Ractor is created.
pub unsafe extern "C" fn native_pause_all_for_ractors(_klass: VALUE) -> VALUE {
    method_entry(|| {
        registry::pause_all_for_ractors();
        Ok(Qnil as VALUE)
    })
}

unsafe extern "C" fn native_stop(rb_self: VALUE) -> VALUE {
    method_entry(|| Ok(ruby_bool(collector_of(rb_self)?.stop()?)))
}

unsafe extern "C" fn running_p(rb_self: VALUE) -> VALUE {
    method_entry(|| Ok(ruby_bool(collector_of(rb_self)?.is_running())))
}

unsafe extern "C" fn live_heap_samples_count(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let collector = collector_of(rb_self)?;
        // Light mode: samples whose objects died are found first, so that
        // the count means what it does in exact mode.
        collector.forget_dead_samples()?;
        let live = collector.with_sampler(|s| s.state.live_count())?;
        ruby_uint(live as u64)
    })
}

/// Collector#window_coverage: the share of this interval's allocations
/// hooked so far, read without a flush.
unsafe extern "C" fn window_coverage(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let coverage = collector_of(rb_self)?.window_coverage()?;
        // SAFETY: may allocate a Float; under protect.
        protect(|| unsafe { rb_float_new(coverage) })
    })
}

/// [stored stacks, frames held as Ruby objects, frames held by name, classes
/// held by name]: for bench/memory_bounds.rb and specs that check what is
/// let go.
unsafe extern "C" fn table_sizes(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let sizes = collector_of(rb_self)?.with_sampler(|s| {
            let stacks = s.state.stacks();
            [
                stacks.len(),
                stacks.frame_count(),
                stacks.resolved_frame_count(),
                s.state.named_class_count(),
            ]
        })?;
        // SAFETY: allocates a four-element Array of Integers; under protect.
        protect(|| unsafe {
            let array = rb_ary_new_capa(4);
            for size in sizes {
                rb_ary_push(array, rb_ull2inum(size as u64));
            }
            array
        })
    })
}

unsafe extern "C" fn internal_error_count(rb_self: VALUE) -> VALUE {
    method_entry(|| ruby_uint(collector_of(rb_self)?.internal_errors()))
}

fn nanos_since_epoch(time: std::time::SystemTime) -> u64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Returns the flush as an Array, turned into a ProfileData on the Ruby
/// side: [pprof_data, allocation_samples_count, heap_samples_count,
/// dropped_samples_nolock, dropped_samples_allocation_bufsize,
/// dropped_samples_heap_bufsize, flush_duration_nsecs,
/// pprof_serialization_nsecs, folded_samples_count, sample_rate,
/// started_at_ns, finished_at_ns, window_coverage, relative_standard_errors,
/// effective_samples, longest_gvl_hold_nsecs].
unsafe extern "C" fn native_flush(
    rb_self: VALUE,
    yield_gvl: VALUE,
    proactively_yield_gvl: VALUE,
    max_profile_bytes: VALUE,
    max_profile_samples: VALUE,
    sample_labels: VALUE,
) -> VALUE {
    method_entry(|| {
        // SAFETY: FIXNUM_P and FIX2LONG read the VALUE's bits only.
        let sample_labels =
            match unsafe { FIXNUM_P(sample_labels).then(|| FIX2LONG(sample_labels)) } {
                Some(0) => SampleLabels::Keep,
                Some(1) => SampleLabels::ClassFrame,
                Some(2) => SampleLabels::Drop,
                // The Ruby side passes 0, 1 or 2 (Collector::SAMPLE_LABELS' index).
                _ => return Err(RbError::argument("sample_labels: expected 0, 1 or 2")),
            };
        // SAFETY: NIL_P and FIXNUM checks read the VALUE's bits only; the
        // Ruby side passes nil or a positive Integer (a Bignum means "no
        // practical limit").
        let limit = |value: VALUE| unsafe {
            if NIL_P(value) || !FIXNUM_P(value) {
                None
            } else {
                usize::try_from(FIX2LONG(value)).ok()
            }
        };
        let max_profile_bytes = limit(max_profile_bytes);
        let max_profile_samples = limit(max_profile_samples);
        let options = FlushOptions {
            yield_gvl: TEST(yield_gvl),
            proactively_yield_gvl: TEST(proactively_yield_gvl),
            max_profile_bytes,
            max_profile_samples,
            sample_labels,
        };
        let result: FlushResult = collector_of(rb_self)?.flush(options)?;
        let numbers = [
            result.allocation_samples as u64,
            result.heap_samples as u64,
            result.drops.nolock,
            result.drops.allocation_bufsize,
            result.drops.heap_bufsize,
            result.flush_duration_nanos,
            result.serialization_nanos,
            result.folded_samples as u64,
        ];
        let times = [
            nanos_since_epoch(result.started_at),
            nanos_since_epoch(result.finished_at),
        ];
        let pprof = &result.pprof;
        let rate = result.sample_rate;
        let coverage = result.window_coverage;
        let spread = result.spreads.map(|total| total.figures());
        let longest_hold = result.longest_gvl_hold_nanos;
        // Everything captured by reference: a raise inside skips no owner.
        protect(|| {
            // SAFETY: plain Ruby allocations with valid pointers and lengths;
            // under protect, so a NoMemoryError comes back as an RbError.
            unsafe {
                let array = rb_ary_new_capa(21);
                rb_ary_push(
                    array,
                    rb_str_new(pprof.as_ptr().cast(), pprof.len() as c_long),
                );
                for n in numbers {
                    rb_ary_push(array, rb_ull2inum(n));
                }
                rb_ary_push(array, rb_float_new(rate));
                for t in times {
                    rb_ary_push(array, rb_ull2inum(t));
                }
                rb_ary_push(array, rb_float_new(coverage));
                // Two frozen Hashes by sample type, made here: ProfileData
                // keeps them as they are.
                let errors = rb_hash_new();
                let effective_samples = rb_hash_new();
                for (name, (rse, effective)) in SAMPLE_TYPE_NAMES.iter().zip(spread) {
                    let key = rb_id2sym(rb_intern(name.as_ptr()));
                    rb_hash_aset(errors, key, rse.map_or(Qnil as VALUE, |x| rb_float_new(x)));
                    let effective = effective.map_or(Qnil as VALUE, |x| rb_float_new(x));
                    rb_hash_aset(effective_samples, key, effective);
                }
                rb_ary_push(array, rb_obj_freeze(errors));
                rb_ary_push(array, rb_obj_freeze(effective_samples));
                rb_ary_push(array, rb_ull2inum(longest_hold));
                array
            }
        })
    })
}

/// Collector#_native_live_sites(per_stack): [[frames, objects, bytes,
/// [object, ...], samples], ...], the stacks with tracked live objects by estimated
/// bytes, largest first; frames leaf first, each [label, file or nil,
/// line]; up to `per_stack` objects a stack. For the child process of a
/// retention report, where GC is off for good; here GC is off (finishing
/// one under way) while it runs.
unsafe extern "C" fn native_live_sites(rb_self: VALUE, per_stack: VALUE) -> VALUE {
    method_entry(|| {
        let collector = collector_of(rb_self)?;
        let per_stack = count_arg(per_stack, "per_stack")?;
        if !collector.is_running() {
            return Err(RbError::state(
                "the collector is not running: its tracked objects are not known to be alive",
            ));
        }
        let gc_off = GcOff::now();
        let names = collector.live_frame_names()?;
        // From here until the objects are in Ruby arrays, no Ruby code runs.
        let sites = collector.live_sites(per_stack, &gc_off)?;
        live_sites_value(&sites, &names)
    })
}

fn ruby_string(text: &str) -> VALUE {
    // SAFETY: copies the bytes into a new String (called under protect).
    unsafe { rb_utf8_str_new(text.as_ptr().cast(), text.len() as c_long) }
}

fn live_sites_value(
    sites: &[LiveSite],
    names: &FastHashMap<FrameRef, FrameInfo>,
) -> RbResult<VALUE> {
    // SAFETY: allocates arrays, strings and numbers (under protect, GC off:
    // no GC, and no Ruby code); every object address is a live object
    // (Collector::live_sites).
    protect(|| unsafe {
        let list = rb_ary_new_capa(sites.len() as c_long);
        for site in sites {
            let frames = rb_ary_new_capa(site.frames.len() as c_long);
            for frame in site.frames.iter() {
                let entry = rb_ary_new_capa(3);
                match names.get(&frame.frame) {
                    Some(info) => {
                        rb_ary_push(entry, ruby_string(&info.name));
                        let file = info.filename.as_deref().map_or(Qnil as VALUE, ruby_string);
                        rb_ary_push(entry, file);
                    }
                    None if frame.frame == TRUNCATION_FRAME => {
                        rb_ary_push(entry, ruby_string("(truncated)"));
                        rb_ary_push(entry, Qnil as VALUE);
                    }
                    None => {
                        rb_ary_push(entry, ruby_string("(unknown)"));
                        rb_ary_push(entry, Qnil as VALUE);
                    }
                }
                rb_ary_push(entry, rb_ull2inum(frame.line.max(0) as u64));
                rb_ary_push(frames, entry);
            }
            let objects = rb_ary_new_capa(site.objects.len() as c_long);
            for &object in &site.objects {
                rb_ary_push(objects, object_value(object));
            }
            let entry = rb_ary_new_capa(5);
            rb_ary_push(entry, frames);
            rb_ary_push(entry, rb_float_new(site.objects_estimate));
            rb_ary_push(entry, rb_float_new(site.bytes_estimate));
            rb_ary_push(entry, objects);
            rb_ary_push(entry, rb_ull2inum(site.samples as u64));
            rb_ary_push(list, entry);
        }
        list
    })
}

pub fn methods() -> Vec<MethodDef> {
    vec![
        method_def!(
            c"_native_live_sites",
            native_live_sites,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"_native_configure",
            native_configure,
            3,
            MethodKind::Private
        ),
        method_def!(
            c"_native_set_sample_rate",
            native_set_sample_rate,
            1,
            MethodKind::Private
        ),
        method_def!(c"_native_set_seed", native_set_seed, 1, MethodKind::Private),
        method_def!(c"sample_rate", sample_rate, 0, MethodKind::Public),
        method_def!(
            c"_native_set_max_allocation_samples",
            native_set_max_allocation_samples,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"max_allocation_samples",
            max_allocation_samples,
            0,
            MethodKind::Public
        ),
        method_def!(
            c"_native_set_max_heap_samples",
            native_set_max_heap_samples,
            1,
            MethodKind::Private
        ),
        method_def!(c"max_heap_samples", max_heap_samples, 0, MethodKind::Public),
        method_def!(
            c"_native_set_allocation_retain_rate",
            native_set_allocation_retain_rate,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"allocation_retain_rate",
            allocation_retain_rate,
            0,
            MethodKind::Public
        ),
        method_def!(
            c"_native_set_size_measurement",
            native_set_size_measurement,
            1,
            MethodKind::Private
        ),
        method_def!(c"_native_set_mode", native_set_mode, 1, MethodKind::Private),
        method_def!(
            c"_native_set_inuse_as_of",
            native_set_inuse_as_of,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"_native_set_window_probability",
            native_set_window_probability,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"_native_set_window_budget",
            native_set_window_budget,
            1,
            MethodKind::Private
        ),
        method_def!(
            c"_native_set_window_warm_up",
            native_set_window_warm_up,
            1,
            MethodKind::Private
        ),
        method_def!(c"_native_start", native_start, 1, MethodKind::Private),
        method_def!(
            c"sampling_paused_for_ractors?",
            sampling_paused_for_ractors_p,
            0,
            MethodKind::Public
        ),
        method_def!(c"_native_stop", native_stop, 0, MethodKind::Private),
        method_def!(c"running?", running_p, 0, MethodKind::Public),
        method_def!(c"window_coverage", window_coverage, 0, MethodKind::Public),
        method_def!(
            c"live_heap_samples_count",
            live_heap_samples_count,
            0,
            MethodKind::Public
        ),
        method_def!(
            c"_native_internal_error_count",
            internal_error_count,
            0,
            MethodKind::Private
        ),
        method_def!(c"_native_flush", native_flush, 5, MethodKind::Private),
        method_def!(c"_native_table_sizes", table_sizes, 0, MethodKind::Private),
    ]
}
