//! The binding layer: the only code that talks to Ruby through rb-sys.
//! It defines the classes and methods, registers the tracepoints and GC
//! callbacks, and converts between Ruby values and the core's plain data.

mod active_collectors;
mod classes;
mod collector;
mod collector_class;
mod empty_hooks;
mod errors;
mod frames;
mod heap;
mod profile_class;

use rb_sys::{
    rb_cObject, rb_define_alloc_func, rb_define_class_under, rb_define_method, rb_define_module,
    rb_define_module_under, rb_define_private_method, rb_define_singleton_method, rb_set_end_proc,
    rb_undef_alloc_func, Qnil, VALUE,
};

use errors::{method_entry, protect};

/// Called by Ruby on `require "memprofiler_pprof_rs/memprofiler_pprof_rs"`.
#[no_mangle]
pub unsafe extern "C" fn Init_memprofiler_pprof_rs() {
    method_entry(|| {
        errors::install_quiet_panic_hook();
        heap::init();
        active_collectors::init();
        empty_hooks::init();
        let methods = collector_class::methods();
        let profile_methods = profile_class::methods();
        protect(|| {
            // SAFETY: runs once at load with the GVL held; every pointer
            // passed is a static C string or a function of the right arity.
            unsafe {
                let module = rb_define_module(c"MemprofilerPprof".as_ptr());
                let collector = rb_define_class_under(module, c"Collector".as_ptr(), rb_cObject);
                rb_define_alloc_func(collector, Some(collector_class::collector_alloc));
                rb_define_singleton_method(
                    collector,
                    c"_native_pause_all_for_ractors".as_ptr(),
                    Some(std::mem::transmute::<
                        *const (),
                        unsafe extern "C" fn() -> VALUE,
                    >(
                        collector_class::native_pause_all_for_ractors as *const ()
                    )),
                    0,
                );
                for method in &methods {
                    let define = if method.private {
                        rb_define_private_method
                    } else {
                        rb_define_method
                    };
                    define(
                        collector,
                        method.name.as_ptr(),
                        Some(method.func),
                        method.arity,
                    );
                }
                // Profile objects come only from Profile.parse / merge.
                let profile = rb_define_class_under(module, c"Profile".as_ptr(), rb_cObject);
                rb_undef_alloc_func(profile);
                for method in &profile_methods {
                    let define = if method.singleton {
                        rb_define_singleton_method
                    } else {
                        rb_define_private_method
                    };
                    define(
                        profile,
                        method.name.as_ptr(),
                        Some(method.func),
                        method.arity,
                    );
                }
                let empty_hooks = rb_define_module_under(module, c"EmptyHooks".as_ptr());
                rb_define_singleton_method(
                    empty_hooks,
                    c"_native_enable".as_ptr(),
                    Some(std::mem::transmute::<
                        *const (),
                        unsafe extern "C" fn() -> VALUE,
                    >(
                        empty_hooks::native_enable as *const ()
                    )),
                    2,
                );
                rb_define_singleton_method(
                    empty_hooks,
                    c"_native_disable".as_ptr(),
                    Some(std::mem::transmute::<
                        *const (),
                        unsafe extern "C" fn() -> VALUE,
                    >(
                        empty_hooks::native_disable as *const ()
                    )),
                    0,
                );
                rb_set_end_proc(Some(active_collectors::disable_all_at_exit), Qnil as VALUE);
                Qnil as VALUE
            }
        })
    });
}
