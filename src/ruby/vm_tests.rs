//! The binding layer inside a real Ruby VM. A process can start one VM,
//! once, and use it from the thread that started it, so every check runs
//! in one test, in order, on a thread of its own whose stack Ruby scans.
//! (The RSpec suite drives the same code through Ruby; these checks reach
//! what Ruby code cannot: `protect` and `method_entry` themselves, a panic
//! turned into an exception, the conversions' refusals.) Only
//! `ruby_setup` runs, not Ruby's prelude, so methods Ruby writes in Ruby
//! (`Kernel#frozen?`, `#tap`) are missing: the checks use C-defined ones.

use std::ffi::CStr;

use rb_sys::{
    rb_cString, rb_eArgError, rb_errinfo, rb_eval_string, rb_gv_set, rb_int2inum, rb_obj_class,
    rb_str_new_cstr, ruby_cleanup, ruby_init_loadpath, ruby_init_stack, ruby_script, ruby_setup,
    Qfalse, Qnil, Qtrue, VALUE,
};

use super::classes::{object_info, resolve_classes};
use super::convert::count_arg;
use super::errors::{method_entry, protect, RbError};
use super::heap;
use super::Init_memprofiler_pprof_rs;
use sampler::types::ClassRef;

/// Runs Ruby code under `protect`.
fn eval(code: &CStr) -> Result<VALUE, RbError> {
    // SAFETY: on the VM's thread; a raise comes back as an error.
    protect(|| unsafe { rb_eval_string(code.as_ptr()) })
}

/// Whether Ruby code evaluates to `true` (not merely truthy).
fn holds(code: &CStr) -> bool {
    match eval(code) {
        Ok(value) => value == Qtrue as VALUE,
        Err(RbError::Exception(exception)) => {
            // SAFETY: on the VM's thread; a global keeps it alive meanwhile.
            unsafe { rb_gv_set(c"$failed".as_ptr(), exception) };
            // SAFETY: a live exception object.
            let class = unsafe { std::ffi::CStr::from_ptr(rb_sys::rb_obj_classname(exception)) };
            let message = eval(c"$failed.message").ok();
            panic!(
                "{code:?} raised {class:?} {:?}",
                message.and_then(super::convert::rust_string)
            )
        }
        Err(other) => panic!("{code:?} failed: {other:?}"),
    }
}

/// The exception a failed call raised, as `$error` for Ruby code to check.
fn raised(result: Result<VALUE, RbError>) -> VALUE {
    match result {
        Err(RbError::Exception(exception)) => {
            // SAFETY: on the VM's thread; a global keeps it alive meanwhile.
            unsafe { rb_gv_set(c"$error".as_ptr(), exception) };
            exception
        }
        Err(other) => panic!("expected an exception, got {other:?}"),
        Ok(value) => panic!("expected an exception, got the value {value:#x}"),
    }
}

fn checks() {
    // The extension's Init, as `require` runs it.
    protect(|| {
        // SAFETY: on the VM's thread, once.
        unsafe { Init_memprofiler_pprof_rs() };
        Qnil as VALUE
    })
    .expect("Init raised");
    // Init installs a quiet panic hook for the host program; this process
    // is the test harness, whose failing tests must still be reported.
    drop(std::panic::take_hook());
    assert!(holds(
        c"MemprofilerPprof::DEFAULTS[:sample_rate] == 0.01 && \
          MemprofilerPprof::DEFAULTS[:mode] == (MemprofilerPprof::LIGHT_MODE_SUPPORTED ? :light : :exact)"
    ));
    assert!(holds(
        c"[MemprofilerPprof::StateError, MemprofilerPprof::InternalError].all? { |c| \
          c.superclass == RuntimeError && c.include?(MemprofilerPprof::Error) }"
    ));

    // protect: a raise comes back as the exception, and $! is cleared.
    let exception = raised(eval(c"raise ArgumentError, 'bad value'"));
    // SAFETY: a live exception object, on the VM's thread.
    assert_eq!(unsafe { rb_obj_class(exception) }, unsafe { rb_eArgError });
    // SAFETY: reads the current exception.
    assert_eq!(unsafe { rb_errinfo() }, Qnil as VALUE);
    assert!(holds(c"$error.message == 'bad value'"));

    // method_entry: an error raises its class, a panic an InternalError
    // that names it, and a success returns the value.
    raised(protect(|| {
        method_entry(|| Err(RbError::state("refused while running")))
    }));
    assert!(holds(
        c"$error.is_a?(MemprofilerPprof::StateError) && $error.message == 'refused while running'"
    ));
    raised(protect(|| method_entry(|| panic!("boom"))));
    assert!(holds(
        c"$error.is_a?(MemprofilerPprof::InternalError) && \
          $error.message.include?('internal error (please report): boom')"
    ));
    assert_eq!(
        protect(|| method_entry(|| Ok(Qfalse as VALUE))).ok(),
        Some(Qfalse as VALUE)
    );

    // count_arg: the gem's argument rule, naming the value.
    // SAFETY (all three): on the VM's thread; plain constructors.
    let (five, minus_one, text) = unsafe {
        (
            rb_int2inum(5),
            rb_int2inum(-1),
            rb_str_new_cstr(c"5".as_ptr()),
        )
    };
    assert_eq!(count_arg(five, "max_heap_samples").ok(), Some(5));
    match count_arg(minus_one, "max_heap_samples") {
        Err(RbError::New(_, message)) => assert!(message.ends_with("got -1"), "{message}"),
        other => panic!("{other:?}"),
    }
    raised(protect(|| {
        method_entry(|| count_arg(text, "max_heap_samples").map(|_| Qnil as VALUE))
    }));
    assert!(holds(
        c"$error.is_a?(TypeError) && $error.message.end_with?('got \"5\"')"
    ));

    // The heap: a new String is a live object with a size and a class.
    assert!(heap::is_live_object(text));
    if heap::can_measure_sizes() {
        assert!(heap::object_size(text).is_some_and(|size| size > 0));
    }
    // SAFETY: `text` is a String made above (its header is written).
    let info = unsafe { object_info(text) };
    // SAFETY: reads a class global.
    let string_class = ClassRef(unsafe { rb_cString });
    assert_eq!(info.class, string_class);
    let names = resolve_classes(&[info.class]).expect("names");
    assert_eq!(names.get(&string_class).map(String::as_str), Some("String"));
    // `text` stays on this thread's stack until here, where Ruby's GC
    // sees it.
    std::hint::black_box(text);
}

#[test]
#[cfg_attr(miri, ignore)]
fn the_binding_layer_in_a_ruby_vm() {
    std::thread::Builder::new()
        .name("ruby-vm".into())
        .stack_size(64 << 20)
        .spawn(|| {
            let mut stack_base: VALUE = 0;
            // SAFETY: this thread's stack outlives the VM (cleaned up below,
            // on it); Ruby scans from here for VALUEs held in locals.
            unsafe { ruby_init_stack(std::ptr::addr_of_mut!(stack_base).cast()) };
            // SAFETY: the first and only VM of this process.
            assert_eq!(unsafe { ruby_setup() }, 0, "ruby_setup failed");
            // SAFETY: after ruby_setup, on its thread.
            unsafe {
                ruby_init_loadpath();
                ruby_script(c"vm_tests".as_ptr());
            }
            checks();
            // SAFETY: on the VM's thread; runs the gem's end proc too.
            assert_eq!(unsafe { ruby_cleanup(0) }, 0);
        })
        .expect("a thread for the VM")
        .join()
        .expect("the VM checks passed");
}
