//! `MemprofilerPprof::Profile`'s native half: a decoded pprof profile
//! (analysis::DecodedProfile) wrapped as TypedData, and the private
//! `_native_*` methods lib/memprofiler_pprof_rs/readers/profile.rb calls after
//! validating arguments. The wrapped data holds no Ruby objects, so there is
//! nothing to mark or move.

use std::ffi::{c_long, CStr};

use rb_sys::{
    rb_ary_new_capa, rb_ary_push, rb_float_new, rb_ll2inum, rb_str_new, rb_ull2inum,
    rb_utf8_str_new, Qfalse, Qnil, Qtrue, NIL_P, RSTRING_LEN, RSTRING_PTR, TEST, VALUE,
};

use super::convert::{array_elements, count_arg, fixnum, is_string, rust_string};
use super::errors::{method_entry, protect, RbError, RbResult};
use super::gvl::without_gvl;
use super::method_table::{method_def, MethodDef, MethodKind};
use super::typed_data::{self, DataType, TypedData};
use analysis::decoded_profile::{
    decompress_within, DecodedProfile, ReadError, ViewError, SHAPE_KEYS,
};
use analysis::diff::{render_diff, DiffOptions};
use analysis::flamegraph::{flame_graph_of, render_html, render_svg, RetentionSite};
use analysis::focus::{FocusPattern, RubyOptions};
use analysis::grouping::GroupBy;
use analysis::merge::merge_within;
use analysis::read_budget::READ_BUDGET;
use analysis::top::{render_top, TopOptions};
use analysis::InputSet;
use pprof::function_errors::parse_function_errors;
use pprof::process_comment::processes_named;

impl TypedData for DecodedProfile {
    const NAME: &'static CStr = c"MemprofilerPprof::Profile";
    const NOUN: &'static str = "profile";
    // Dropping it frees Rust memory only.
    const FREE_IMMEDIATELY: bool = true;
    const HOLDS_OBJECTS: bool = false;

    fn memory_bytes(&self) -> usize {
        DecodedProfile::memory_bytes(self)
    }
}

static PROFILE_TYPE: DataType<DecodedProfile> = DataType::of();

/// Hands `profile` to Ruby as an instance of `klass`.
pub(super) fn wrap(klass: VALUE, profile: DecodedProfile) -> RbResult<VALUE> {
    typed_data::wrap(klass, profile, &PROFILE_TYPE)
}

pub(super) fn profile_of(object: VALUE) -> RbResult<&'static DecodedProfile> {
    typed_data::get(object, &PROFILE_TYPE)
}

fn string_arg(value: VALUE, name: &str) -> RbResult<String> {
    rust_string(value).ok_or_else(|| RbError::type_error(format!("{name} must be a String")))
}

fn optional_string_arg(value: VALUE, name: &str) -> RbResult<Option<String>> {
    if NIL_P(value) {
        Ok(None)
    } else {
        string_arg(value, name).map(Some)
    }
}

fn utf8_result(text: &str) -> RbResult<VALUE> {
    // SAFETY: pointer and length describe `text`'s bytes; under protect.
    protect(|| unsafe { rb_utf8_str_new(text.as_ptr().cast(), text.len() as c_long) })
}

fn binary_result(bytes: &[u8]) -> RbResult<VALUE> {
    // SAFETY: as in utf8_result.
    protect(|| unsafe { rb_str_new(bytes.as_ptr().cast(), bytes.len() as c_long) })
}

/// `Profile._native_parse(bytes)`: a Profile, or the reason (a String) the
/// bytes are not one, or `[reason]` when the read budget refused them; the
/// Ruby side raises ProfileFormatError or ProfileMemoryLimitError with it.
unsafe extern "C" fn native_parse(klass: VALUE, bytes: VALUE) -> VALUE {
    method_entry(|| {
        if !is_string(bytes) {
            return Err(RbError::type_error("profile data must be a String"));
        }
        // SAFETY: `bytes` is a String; reading its length calls nothing.
        let length = unsafe { RSTRING_LEN(bytes) } as usize;
        let copy = match READ_BUDGET.reserve(length as u64) {
            Ok(copy) => copy,
            Err(refused) => {
                return memory_refusal(&ReadError::OverBudget(refused).to_string());
            }
        };
        // SAFETY: `bytes` is a String; its buffer stays valid and unmoved
        // while it is copied (nothing in between calls into Ruby).
        let owned =
            unsafe { std::slice::from_raw_parts(RSTRING_PTR(bytes).cast::<u8>(), length).to_vec() };
        // Decoding a large profile takes a while: other threads run
        // meanwhile (a /debug/pprof request must not stop the app).
        let decoded = without_gvl(|| DecodedProfile::decode_reserved(&owned, copy))?;
        drop(owned);
        match decoded {
            Ok(profile) => wrap(klass, profile),
            Err(error @ ReadError::OverBudget(_)) => memory_refusal(&error.to_string()),
            Err(error) => utf8_result(&error.to_string()),
        }
    })
}

/// `[message]`: what the read budget refused, told apart from a result.
pub(super) fn memory_refusal(message: &str) -> RbResult<VALUE> {
    let message = utf8_result(message)?;
    // SAFETY: plain allocation under protect; `message` is a local.
    protect(|| unsafe {
        let array = rb_ary_new_capa(1);
        rb_ary_push(array, message);
        array
    })
}

/// `Profile._native_gunzip(bytes)`: the bytes gunzipped (or as they are
/// if not gzip), or the reason (a String) they could not be; the Ruby side
/// raises ProfileFormatError with it. Unlike Ruby's zlib, which resizes its
/// output String with the GVL released (a fork meanwhile corrupts the
/// child's heap), this keeps the GVL and touches no Ruby object until done.
unsafe extern "C" fn native_gunzip(_klass: VALUE, bytes: VALUE) -> VALUE {
    method_entry(|| {
        if !is_string(bytes) {
            return Err(RbError::type_error("data must be a String"));
        }
        // The output is reserved while it is made; once a Ruby String, it
        // is the caller's (PprofReader counts it in its own estimate).
        let mut transient = READ_BUDGET
            .reserve(0)
            .map_err(|refused| RbError::state(refused.to_string()))?;
        let memory = |refused| gunzip_error(&ReadError::OverBudget(refused));
        // SAFETY: `bytes` is a String whose buffer stays valid and unmoved:
        // nothing below calls into Ruby while `plain` may borrow it.
        let plain = unsafe {
            let slice = std::slice::from_raw_parts(
                RSTRING_PTR(bytes).cast::<u8>(),
                RSTRING_LEN(bytes) as usize,
            );
            decompress_within(slice, &mut transient).map(|plain| plain.into_owned())
        };
        match plain {
            Ok(plain) => {
                // Its copy into a Ruby String, for a moment beside it.
                if let Err(refused) = transient.grow(plain.len() as u64) {
                    return memory(refused);
                }
                let result = binary_result(&plain)?;
                // SAFETY: tags the new String (a local) as binary; no raise.
                unsafe { rb_sys::rb_enc_associate_index(result, rb_sys::rb_ascii8bit_encindex()) };
                Ok(result)
            }
            Err(error) => gunzip_error(&error),
        }
    })
}

/// `[message, memory]`: why gunzip failed (an Array tells it from data,
/// both Strings), and whether the read budget refused it.
fn gunzip_error(error: &ReadError) -> RbResult<VALUE> {
    let message = utf8_result(&error.to_string())?;
    let memory = matches!(error, ReadError::OverBudget(_));
    // SAFETY: plain allocation under protect; `message` is a local.
    protect(|| unsafe {
        let array = rb_ary_new_capa(2);
        rb_ary_push(array, message);
        rb_ary_push(array, if memory { Qtrue } else { Qfalse } as VALUE);
        array
    })
}

/// `Profile._native_memory_limit` → bytes.
unsafe extern "C" fn native_memory_limit(_klass: VALUE) -> VALUE {
    method_entry(|| {
        let limit = READ_BUDGET.limit();
        // SAFETY: allocates at most a Bignum, under protect.
        protect(|| unsafe { rb_ull2inum(limit) })
    })
}

/// `Profile._native_set_memory_limit(bytes)` (validated by the Ruby side).
unsafe extern "C" fn native_set_memory_limit(_klass: VALUE, bytes: VALUE) -> VALUE {
    method_entry(|| {
        let bytes = count_arg(bytes, "memory_limit")?;
        READ_BUDGET.set_limit(bytes as u64);
        Ok(Qnil as VALUE)
    })
}

/// `Profile._native_memory_held` → bytes held by profiles read back.
unsafe extern "C" fn native_memory_held(_klass: VALUE) -> VALUE {
    method_entry(|| {
        let held = READ_BUDGET.held();
        // SAFETY: allocates at most a Bignum, under protect.
        protect(|| unsafe { rb_ull2inum(held) })
    })
}

/// `[[type, unit], ...]`
unsafe extern "C" fn native_sample_types(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let types = profile_of(rb_self)?.sample_types();
        // One protect for every allocation: each new String is pushed into
        // an Array held by a local (seen by the GC's stack scan) at once.
        // SAFETY: plain allocations with valid pointers and lengths.
        protect(|| unsafe {
            let array = rb_ary_new_capa(types.len() as c_long);
            for (t, u) in &types {
                let pair = rb_ary_new_capa(2);
                rb_ary_push(array, pair);
                rb_ary_push(pair, rb_utf8_str_new(t.as_ptr().cast(), t.len() as c_long));
                rb_ary_push(pair, rb_utf8_str_new(u.as_ptr().cast(), u.len() as c_long));
            }
            array
        })
    })
}

/// Name of the default sample type (the profile's, or the last one).
unsafe extern "C" fn native_default_sample_type(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let index = profile.sample_index(None).map_err(RbError::argument)?;
        utf8_result(&profile.sample_types()[index].0)
    })
}

/// `[sample_count, time_nanos, duration_nanos, period]`
unsafe extern "C" fn native_summary(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let numbers = [
            profile.sample_count() as u64,
            profile.raw.time_nanos.max(0) as u64,
            profile.raw.duration_nanos.max(0) as u64,
            profile.raw.period.max(0) as u64,
        ];
        // SAFETY: plain allocations under one protect, each pushed into the
        // Array (held by a local) as soon as it is made.
        protect(|| unsafe {
            let array = rb_ary_new_capa(4);
            for n in numbers {
                rb_ary_push(array, rb_ull2inum(n));
            }
            array
        })
    })
}

/// The profile's comments, each distinct string once.
unsafe extern "C" fn native_comments(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let comments = profile_of(rb_self)?.comments();
        // SAFETY: as in native_summary.
        protect(|| unsafe {
            let array = rb_ary_new_capa(comments.len() as c_long);
            for comment in &comments {
                rb_ary_push(
                    array,
                    rb_utf8_str_new(comment.as_ptr().cast(), comment.len() as c_long),
                );
            }
            array
        })
    })
}

/// `[[name, [flat, cum] of each of the four values, flattened (a Float
/// or nil)], ...]`, by name: the errors the profile gives of its leading
/// functions (pprof/function_errors.rs).
unsafe extern "C" fn native_function_errors(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let mut errors: Vec<_> = parse_function_errors(&profile_of(rb_self)?.comments())
            .into_iter()
            .collect();
        errors.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // SAFETY: plain allocations with valid pointers and lengths, each
        // pushed at once into an Array held by a local (seen by the GC's
        // stack scan).
        protect(|| unsafe {
            let array = rb_ary_new_capa(errors.len() as c_long);
            for (name, values) in &errors {
                let entry = rb_ary_new_capa(2);
                rb_ary_push(array, entry);
                rb_ary_push(
                    entry,
                    rb_utf8_str_new(name.as_ptr().cast(), name.len() as c_long),
                );
                let numbers = rb_ary_new_capa(8);
                rb_ary_push(entry, numbers);
                for value in values.iter().flatten() {
                    let number = match value {
                        Some(rse) => rb_float_new(*rse),
                        None => Qnil as VALUE,
                    };
                    rb_ary_push(numbers, number);
                }
            }
            array
        })
    })
}

/// `[[pid, started_millis, forked_from or nil, program], ...]`: the
/// processes the profile's comments name.
unsafe extern "C" fn native_processes(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let processes = processes_named(profile_of(rb_self)?.comments());
        // SAFETY: plain allocations with valid pointers and lengths, each
        // pushed at once into an Array held by a local (seen by the GC's
        // stack scan).
        protect(|| unsafe {
            let array = rb_ary_new_capa(processes.len() as c_long);
            for process in &processes {
                let entry = rb_ary_new_capa(4);
                rb_ary_push(array, entry);
                rb_ary_push(entry, rb_ull2inum(u64::from(process.pid)));
                rb_ary_push(entry, rb_ll2inum(process.started_millis));
                rb_ary_push(
                    entry,
                    process
                        .forked_from
                        .map_or(Qnil as VALUE, |parent| rb_ull2inum(u64::from(parent))),
                );
                rb_ary_push(
                    entry,
                    rb_utf8_str_new(
                        process.program.as_ptr().cast(),
                        process.program.len() as c_long,
                    ),
                );
            }
            array
        })
    })
}

/// `[[name, count], ...]`: `DecodedProfile::shape`, named.
unsafe extern "C" fn native_shape(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let shape = profile_of(rb_self)?.shape();
        // One protect for every allocation: each new object is pushed into
        // an Array held by a local (seen by the GC's stack scan) at once; a
        // VALUE kept only in a Rust Vec would not be seen.
        // SAFETY: plain allocations with valid pointers and lengths.
        protect(|| unsafe {
            let array = rb_ary_new_capa(shape.len() as c_long);
            for (name, count) in SHAPE_KEYS.iter().zip(shape) {
                let pair = rb_ary_new_capa(2);
                rb_ary_push(array, pair);
                rb_ary_push(
                    pair,
                    rb_utf8_str_new(name.as_ptr().cast(), name.len() as c_long),
                );
                rb_ary_push(pair, rb_ull2inum(count));
            }
            array
        })
    })
}

/// Total of each sample type, in order.
unsafe extern "C" fn native_totals(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let totals: Vec<i64> = (0..profile.raw.sample_type.len())
            .map(|i| profile.total(i))
            .collect();
        // SAFETY: plain allocations under protect.
        protect(|| unsafe {
            let array = rb_ary_new_capa(totals.len() as c_long);
            for total in &totals {
                rb_ary_push(array, rb_sys::rb_ll2inum(*total));
            }
            array
        })
    })
}

/// A focus pattern's arguments: a Regexp's source (UTF-8; the Ruby side
/// converts it) and its Regexp#options.
fn focus_pattern_args(source: VALUE, options: VALUE) -> RbResult<(Vec<u8>, RubyOptions)> {
    if !is_string(source) {
        return Err(RbError::type_error("focus source must be a String"));
    }
    let bits = fixnum(options)
        .and_then(|bits| u64::try_from(bits).ok())
        .ok_or_else(|| RbError::type_error("focus options must be an Integer >= 0"))?;
    // SAFETY: `source` is a String; its buffer stays valid and unmoved while
    // it is copied (nothing in between calls into Ruby).
    let bytes = unsafe {
        std::slice::from_raw_parts(
            RSTRING_PTR(source).cast::<u8>(),
            RSTRING_LEN(source) as usize,
        )
        .to_vec()
    };
    Ok((bytes, RubyOptions::from_bits(bits)))
}

/// `Profile._native_focus_error(source, options)`: nil if the pattern can
/// be matched (in linear time), else why not (a String to follow
/// "focus /.../ "; the Ruby side raises ArgumentError with it).
unsafe extern "C" fn native_focus_error(_klass: VALUE, source: VALUE, options: VALUE) -> VALUE {
    method_entry(|| {
        let (source, options) = focus_pattern_args(source, options)?;
        // Compiling a long pattern takes a while: without the GVL.
        match without_gvl(|| FocusPattern::new(&source, options).map(drop))? {
            Ok(()) => Ok(Qnil as VALUE),
            Err(error) => utf8_result(&error.to_string()),
        }
    })
}

/// `#_native_focus_frames(source, options)`: the frames (by index, for
/// `_native_top`'s focus) whose name or file the pattern matches, or why it
/// cannot be matched (a String, as in `_native_focus_error`).
unsafe extern "C" fn native_focus_frames(rb_self: VALUE, source: VALUE, options: VALUE) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let (source, options) = focus_pattern_args(source, options)?;
        // Without the GVL, as top: names can be megabytes long, and other
        // threads run meanwhile. `rb_self` keeps the profile alive.
        let frames = without_gvl(|| {
            FocusPattern::new(&source, options).map(|pattern| pattern.matching_frames(profile))
        })?;
        let frames = match frames {
            Ok(frames) => frames,
            Err(error) => return utf8_result(&error.to_string()),
        };
        // SAFETY: plain allocations under one protect, each pushed into the
        // Array (held by a local) as soon as it is made; `frames` is only
        // borrowed, its owner is outside.
        protect(|| unsafe {
            let array = rb_ary_new_capa(frames.len() as c_long);
            for frame in &frames {
                rb_ary_push(array, rb_ull2inum(u64::from(*frame)));
            }
            array
        })
    })
}

fn focus_arg(value: VALUE, frames: usize) -> RbResult<Option<InputSet<u32>>> {
    if NIL_P(value) {
        return Ok(None);
    }
    let mut focus = InputSet::default();
    for element in array_elements(value, "focus")? {
        let index = count_arg(element, "a focus frame index")?;
        if index >= frames {
            return Err(RbError::argument(format!(
                "focus frame index {index} is out of range"
            )));
        }
        focus.insert(index as u32);
    }
    Ok(Some(focus))
}

fn group_by_arg(value: VALUE) -> RbResult<GroupBy> {
    let name = string_arg(value, "by")?;
    GroupBy::parse(&name).ok_or_else(|| {
        RbError::argument(format!(
            "by must be one of function, line, class, file, gem or a label key; got {name:?}"
        ))
    })
}

/// `#_native_top(sample_type, by, limit, focus, focus_description,
/// sort_by_cum, base_dir, title)` → the table as a String.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn native_top(
    rb_self: VALUE,
    sample_type: VALUE,
    by: VALUE,
    limit: VALUE,
    focus: VALUE,
    focus_description: VALUE,
    sort_by_cum: VALUE,
    base_dir: VALUE,
    title: VALUE,
) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let options = TopOptions {
            sample_type: optional_string_arg(sample_type, "sample_index")?,
            by: group_by_arg(by)?,
            limit: count_arg(limit, "limit")?,
            focus: focus_arg(focus, profile.frames.len())?,
            focus_description: string_arg(focus_description, "focus description")?,
            sort_by_cum: TEST(sort_by_cum),
            base_dir: string_arg(base_dir, "base_dir")?,
            title: string_arg(title, "title")?,
        };
        // (Pure Rust over an immutable profile `rb_self` keeps alive: other
        // threads run meanwhile, as in parse.)
        let text = without_gvl(|| render_top(profile, &options))?.map_err(RbError::argument)?;
        utf8_result(&text)
    })
}

fn profiles_arg(value: VALUE) -> RbResult<Vec<&'static DecodedProfile>> {
    array_elements(value, "profiles")?
        .into_iter()
        .map(profile_of)
        .collect()
}

/// `Profile._native_diff(profiles, sample_type, limit, base_dir, titles,
/// by_label)`
unsafe extern "C" fn native_diff(
    _klass: VALUE,
    profiles: VALUE,
    sample_type: VALUE,
    limit: VALUE,
    base_dir: VALUE,
    titles: VALUE,
    by_label: VALUE,
) -> VALUE {
    method_entry(|| {
        let list = profiles_arg(profiles)?;
        let titles = array_elements(titles, "titles")?
            .into_iter()
            .map(|t| string_arg(t, "a title"))
            .collect::<RbResult<Vec<String>>>()?;
        let options = DiffOptions {
            sample_type: optional_string_arg(sample_type, "sample_index")?,
            limit: count_arg(limit, "limit")?,
            base_dir: string_arg(base_dir, "base_dir")?,
            titles,
            by_label: optional_string_arg(by_label, "by")?,
        };
        // (`profiles`, on this method's stack, keeps them alive.)
        let text = without_gvl(|| render_diff(&list, &options))?.map_err(RbError::argument)?;
        utf8_result(&text)
    })
}

/// `Profile._native_merge(profiles)` → a new Profile, or `[reason]` when
/// the read budget refused it.
unsafe extern "C" fn native_merge(klass: VALUE, profiles: VALUE) -> VALUE {
    method_entry(|| {
        let list = profiles_arg(profiles)?;
        // (`profiles`, on this method's stack, keeps them alive.)
        match without_gvl(|| merge_within(&list, &READ_BUDGET))? {
            Ok(profile) => wrap(klass, profile),
            Err(ViewError::Argument(message)) => Err(RbError::argument(message)),
            Err(ViewError::Memory(message)) => memory_refusal(&message),
        }
    })
}

/// `#_native_to_pprof(default_sample_type)` → gzipped pprof bytes.
unsafe extern "C" fn native_to_pprof(rb_self: VALUE, default_sample_type: VALUE) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let default = optional_string_arg(default_sample_type, "default_sample_type")?;
        // Without the GVL, as parse: the profile is immutable, and `rb_self`
        // (on this method's stack) keeps it alive.
        match without_gvl(|| profile.to_pprof(default.as_deref()))? {
            // (`written` holds the budget for the copy until it is made.)
            Ok(written) => binary_result(&written.bytes),
            Err(ViewError::Argument(message)) => Err(RbError::argument(message)),
            Err(ViewError::Memory(message)) => memory_refusal(&message),
        }
    })
}

/// `#_native_flamegraph(sample_type, format, title, retainers)` → HTML or
/// SVG; `retainers`: [[site, [path, ...]], ...] for the HTML page.
unsafe extern "C" fn native_flamegraph(
    rb_self: VALUE,
    sample_type: VALUE,
    format: VALUE,
    title: VALUE,
    retainers: VALUE,
) -> VALUE {
    method_entry(|| {
        let profile = profile_of(rb_self)?;
        let sample_type = optional_string_arg(sample_type, "sample_index")?;
        let format = string_arg(format, "format")?;
        let title = string_arg(title, "title")?;
        let retainers = retention_sites_arg(retainers)?;
        if format != "html" && format != "svg" {
            return Err(RbError::argument(format!(
                "format must be html or svg, got {format:?}"
            )));
        }
        let text = without_gvl(|| {
            let mut input = flame_graph_of(profile, sample_type.as_deref(), title)?;
            input.retainers = retainers;
            Ok::<String, String>(if format == "html" {
                render_html(&input)
            } else {
                render_svg(&input)
            })
        })?
        .map_err(RbError::argument)?;
        utf8_result(&text)
    })
}

/// [[site, [path, ...]], ...] (RetentionReport#flame_graph_sites).
fn retention_sites_arg(value: VALUE) -> RbResult<Vec<RetentionSite>> {
    array_elements(value, "retainers")?
        .into_iter()
        .map(
            |entry| match array_elements(entry, "a retainers entry")?.as_slice() {
                &[site, paths] => Ok(RetentionSite {
                    site: string_arg(site, "a retainers site")?,
                    paths: array_elements(paths, "a retainers site's paths")?
                        .into_iter()
                        .map(|path| string_arg(path, "a retainers path"))
                        .collect::<RbResult<_>>()?,
                }),
                _ => Err(RbError::argument(
                    "a retainers entry must be [site, [path, ...]]",
                )),
            },
        )
        .collect()
}

pub fn methods() -> Vec<MethodDef> {
    vec![
        method_def!(c"_native_parse", native_parse, 1, MethodKind::Singleton),
        method_def!(c"_native_gunzip", native_gunzip, 1, MethodKind::Singleton),
        method_def!(c"_native_diff", native_diff, 6, MethodKind::Singleton),
        method_def!(c"_native_merge", native_merge, 1, MethodKind::Singleton),
        method_def!(
            c"_native_memory_limit",
            native_memory_limit,
            0,
            MethodKind::Singleton
        ),
        method_def!(
            c"_native_set_memory_limit",
            native_set_memory_limit,
            1,
            MethodKind::Singleton
        ),
        method_def!(
            c"_native_memory_held",
            native_memory_held,
            0,
            MethodKind::Singleton
        ),
        method_def!(
            c"_native_sample_types",
            native_sample_types,
            0,
            MethodKind::Private
        ),
        method_def!(
            c"_native_default_sample_type",
            native_default_sample_type,
            0,
            MethodKind::Private
        ),
        method_def!(c"_native_summary", native_summary, 0, MethodKind::Private),
        method_def!(c"_native_comments", native_comments, 0, MethodKind::Private),
        method_def!(
            c"_native_function_errors",
            native_function_errors,
            0,
            MethodKind::Private
        ),
        method_def!(
            c"_native_processes",
            native_processes,
            0,
            MethodKind::Private
        ),
        method_def!(c"_native_totals", native_totals, 0, MethodKind::Private),
        method_def!(c"_native_shape", native_shape, 0, MethodKind::Private),
        method_def!(
            c"_native_focus_error",
            native_focus_error,
            2,
            MethodKind::Singleton
        ),
        method_def!(
            c"_native_focus_frames",
            native_focus_frames,
            2,
            MethodKind::Private
        ),
        method_def!(c"_native_top", native_top, 8, MethodKind::Private),
        method_def!(c"_native_to_pprof", native_to_pprof, 1, MethodKind::Private),
        method_def!(
            c"_native_flamegraph",
            native_flamegraph,
            4,
            MethodKind::Private
        ),
    ]
}
