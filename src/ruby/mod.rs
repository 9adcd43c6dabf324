//! The binding layer: the only code that talks to Ruby through rb-sys.
//! It defines the classes and methods, registers the tracepoints and GC
//! callbacks, and converts between Ruby values and the sampler's plain data.

mod classes;
mod collector;
mod collector_class;
mod convert;
#[cfg(feature = "bench-hooks")]
mod empty_hooks;
mod errors;
mod frames;
mod gvl;
mod heap;
mod hooks;
mod labels;
mod merger_class;
mod method_blocks;
mod method_table;
mod process_identity;
mod profile_class;
mod registry;
mod typed_data;
#[cfg(test)]
mod vm_tests;
mod window_timer;

use rb_sys::{
    rb_cObject, rb_define_alloc_func, rb_define_class_under, rb_define_const, rb_define_module,
    rb_float_new, rb_hash_aset, rb_hash_new, rb_id2sym, rb_intern, rb_obj_freeze, rb_set_end_proc,
    rb_undef_alloc_func, Qfalse, Qnil, Qtrue, VALUE,
};

use errors::{method_entry, protect};
use method_table::{define_methods, method_def, MethodKind};

/// Called by Ruby on `require "memprofiler_pprof_rs/memprofiler_pprof_rs"`.
#[no_mangle]
pub unsafe extern "C" fn Init_memprofiler_pprof_rs() {
    method_entry(|| {
        errors::install_quiet_panic_hook();
        heap::init();
        process_identity::init();
        registry::init();
        labels::init();
        #[cfg(feature = "bench-hooks")]
        empty_hooks::init();
        let mut collector_methods = collector_class::methods();
        collector_methods.push(method_def!(
            c"_native_pause_all_for_ractors",
            collector_class::native_pause_all_for_ractors,
            0,
            MethodKind::Singleton
        ));
        let profile_methods = profile_class::methods();
        let merger_methods = merger_class::methods();
        let label_methods = labels::methods();
        #[cfg(feature = "bench-hooks")]
        let empty_hooks_methods = [
            method_def!(
                c"_native_enable",
                empty_hooks::native_enable,
                2,
                MethodKind::Singleton
            ),
            method_def!(
                c"_native_disable",
                empty_hooks::native_disable,
                0,
                MethodKind::Singleton
            ),
        ];
        protect(|| {
            // SAFETY: runs once at load with the GVL held, under protect;
            // every pointer passed is a static C string, a live class, or a
            // function of the right arity.
            unsafe {
                let module = rb_define_module(c"MemprofilerPprof".as_ptr());
                let collector = rb_define_class_under(module, c"Collector".as_ptr(), rb_cObject);
                rb_define_alloc_func(collector, Some(collector_class::collector_alloc));
                define_methods(collector, &collector_methods);
                // Profile objects come only from Profile.parse / merge.
                let profile = rb_define_class_under(module, c"Profile".as_ptr(), rb_cObject);
                rb_undef_alloc_func(profile);
                define_methods(profile, &profile_methods);
                let merger = rb_define_class_under(profile, c"Merger".as_ptr(), rb_cObject);
                rb_define_alloc_func(merger, Some(merger_class::merger_alloc));
                define_methods(merger, &merger_methods);
                let labels_module = rb_sys::rb_define_module_under(module, c"Labels".as_ptr());
                define_methods(labels_module, &label_methods);
                rb_define_const(
                    labels_module,
                    c"FIBER_KEY".as_ptr(),
                    labels::fiber_key_symbol(),
                );
                #[cfg(feature = "bench-hooks")]
                define_methods(
                    rb_sys::rb_define_module_under(module, c"EmptyHooks".as_ptr()),
                    &empty_hooks_methods,
                );
                define_defaults(module);
                errors::define_errors(module);
                rb_set_end_proc(Some(registry::disable_all_at_exit), Qnil as VALUE);
                Qnil as VALUE
            }
        })
    });
}

/// `MemprofilerPprof::DEFAULTS`: the one home of the collector's default
/// settings. A Collector starts with the counts natively (before
/// #initialize), which applies the mode and windows; the Ruby side
/// (Collector.new, EnvConfig) reads them all from here.
///
/// # Safety
/// GVL held, under protect (allocates and may raise NoMemoryError).
unsafe fn define_defaults(module: VALUE) {
    use collector::{
        Mode, DEFAULT_MAX_ALLOCATION_SAMPLES, DEFAULT_MAX_HEAP_SAMPLES, DEFAULT_MODE,
        DEFAULT_SAMPLE_RATE, DEFAULT_WINDOW_BUDGET, DEFAULT_WINDOW_WARM_UP, LIGHT_MODE_SUPPORTED,
    };
    let default_mode = match DEFAULT_MODE {
        Mode::Light => c"light",
        Mode::Exact => c"exact",
    };
    // SAFETY: the caller holds the GVL under protect; the keys are static C
    // strings; rb_int2inum takes any isize.
    unsafe {
        let defaults = rb_hash_new();
        let entries = [
            (c"sample_rate", rb_float_new(DEFAULT_SAMPLE_RATE)),
            (
                c"max_allocation_samples",
                rb_sys::rb_int2inum(DEFAULT_MAX_ALLOCATION_SAMPLES as _),
            ),
            (
                c"max_heap_samples",
                rb_sys::rb_int2inum(DEFAULT_MAX_HEAP_SAMPLES as _),
            ),
            (c"mode", rb_id2sym(rb_intern(default_mode.as_ptr()))),
            (
                c"window_budget",
                rb_sys::rb_int2inum(DEFAULT_WINDOW_BUDGET as _),
            ),
            (
                c"window_warm_up",
                rb_sys::rb_int2inum(DEFAULT_WINDOW_WARM_UP as _),
            ),
        ];
        for (key, value) in entries {
            rb_hash_aset(defaults, rb_id2sym(rb_intern(key.as_ptr())), value);
        }
        rb_obj_freeze(defaults);
        rb_define_const(module, c"DEFAULTS".as_ptr(), defaults);
        let light = if LIGHT_MODE_SUPPORTED { Qtrue } else { Qfalse };
        rb_define_const(module, c"LIGHT_MODE_SUPPORTED".as_ptr(), light as VALUE);
    }
}
