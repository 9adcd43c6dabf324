//! How sure each of a profile's leading functions is, as comments: the
//! relative standard error of its flat and cum values.
//!
//! The total's error (spread_comment.rs) says little of a function's: a
//! function that allocates in runs (a loop in one request) is met by a few
//! windows or by none, and its value spreads by how many windows met it,
//! many times what its share of the samples suggests. So the flush
//! estimates each function's spread as the total's is, over its own values
//! (sampler::spread::keyed_spreads), for the functions a reader looks at
//! first (the leading ones by flat or cum of each value; by cum, past the
//! spine of functions on nearly every stack), one comment each:
//!
//!   relative standard error of a function, flat and cum (%): alloc_objects 3.1 2.0 alloc_space 3.3 2.1 inuse_objects - 5.0 inuse_space - 8.0 in Foo#bar
//!
//! "-" where the function has no such value. The name comes last, so any
//! name reads back whole. `FunctionKeys` gathers, while a profile is built,
//! which functions each emitted stack holds, named as the profile names
//! them (blocks included), and works the comments out once per flush.

use std::collections::HashMap;

use sampler::fast_hash::FastHashMap;
use sampler::spread::{keyed_spreads, widen_for_unobserved, Spread, UnseenWeights};
use sampler::stack_table::StackId;
use sampler::state::FlushSnapshot;
use sampler::types::ClassRef;

use super::spread_comment::VALUE_NAMES;
use super::string_table::StringTable;

const PREFIX: &str = "relative standard error of a function, flat and cum (%): ";
const NAME_SEPARATOR: &str = " in ";

/// The leading functions by each value, flat and cum, that get a comment.
pub const FUNCTIONS_PER_VALUE: usize = 20;

/// A function whose cum is at least this share of a value's total is on
/// nearly every stack: its error is the total's, and it gets no comment.
pub const SPINE_SHARE: f64 = 0.99;

/// Readers give a row of at least this share of the total the total's
/// error when the profile gives none for it: a little below SPINE_SHARE,
/// so that rounding the values to whole numbers leaves no row between.
pub const SPINE_FALLBACK_SHARE: f64 = 0.985;

/// One function's relative standard errors: [value type][flat, cum]
/// (None: no such value).
pub type FunctionErrors = [[Option<f64>; 2]; 4];

/// The comments for the functions worth one: `names[k]` is key k's name,
/// `flat[k]` and `cum[k]` its spreads.
/// `totals`: the profile's totals of the four values, every row included
/// (what `top` measures a row against).
pub fn function_error_comments(
    names: &[String],
    flat: &[[Spread; 4]],
    cum: &[[Spread; 4]],
    totals: [f64; 4],
) -> Vec<String> {
    let mut chosen = vec![false; names.len()];
    for (spreads, by_cum) in [(flat, false), (cum, true)] {
        for index in 0..4 {
            // Cum leaves out the spine (functions on nearly every stack:
            // a server's loop, its framework's layers): the total's error
            // is theirs, and there are often more of them than places.
            let total = totals[index];
            let spine =
                |k: usize| by_cum && total > 0.0 && spreads[k][index].total >= SPINE_SHARE * total;
            let mut keys: Vec<usize> = (0..spreads.len().min(names.len()))
                .filter(|&k| spreads[k][index].total > 0.0 && !spine(k))
                .collect();
            keys.sort_by(|&a, &b| {
                spreads[b][index]
                    .total
                    .total_cmp(&spreads[a][index].total)
                    .then(a.cmp(&b))
            });
            for k in keys.into_iter().take(FUNCTIONS_PER_VALUE) {
                chosen[k] = true;
            }
        }
    }
    let mut comments = Vec::new();
    for (k, name) in names.iter().enumerate() {
        if !chosen[k] {
            continue;
        }
        let mut line = String::from(PREFIX);
        for (index, type_name) in VALUE_NAMES.iter().enumerate() {
            line.push_str(type_name);
            for spreads in [flat, cum] {
                line.push(' ');
                match spreads
                    .get(k)
                    .and_then(|s| s[index].relative_standard_error())
                {
                    Some(rse) => line.push_str(&format!("{:.1}", 100.0 * rse)),
                    None => line.push('-'),
                }
            }
            line.push(' ');
        }
        line.pop();
        line.push_str(NAME_SEPARATOR);
        line.push_str(name);
        comments.push(line);
    }
    comments
}

/// Whether a comment is one of these (or says they were not worked out).
pub fn is_function_error_comment(comment: &str) -> bool {
    comment.starts_with(COMMENT_STEM)
}

/// What every such comment begins with.
const COMMENT_STEM: &str = "relative standard error of a function";

/// The errors the comments give, by function name (a profile without them
/// gives none; a name given twice, as merged profiles would, is left out:
/// which profile's it is cannot be told). Keyed by names a file being read
/// chooses: std's randomly keyed hasher, so crafted names cannot collide.
pub fn parse_function_errors<S: AsRef<str>>(comments: &[S]) -> HashMap<String, FunctionErrors> {
    let mut errors = HashMap::new();
    let mut repeated = Vec::new();
    for comment in comments {
        let Some((name, parsed)) = parse_line(comment.as_ref()) else {
            continue;
        };
        if errors.insert(name.to_string(), parsed).is_some() {
            repeated.push(name.to_string());
        }
    }
    for name in repeated {
        errors.remove(&name);
    }
    errors
}

fn parse_line(comment: &str) -> Option<(&str, FunctionErrors)> {
    let rest = comment.strip_prefix(PREFIX)?;
    let mut parsed: FunctionErrors = [[None; 2]; 4];
    let mut tokens = rest.splitn(13, ' ');
    for (index, type_name) in VALUE_NAMES.iter().enumerate() {
        if tokens.next()? != *type_name {
            return None;
        }
        for slot in &mut parsed[index] {
            let token = tokens.next()?;
            *slot = match token {
                "-" => None,
                number => {
                    let percent: f64 = number.parse().ok()?;
                    if !(percent.is_finite() && percent >= 0.0) {
                        return None;
                    }
                    Some(percent / 100.0)
                }
            };
        }
    }
    let name = tokens.next()?.strip_prefix(NAME_SEPARATOR.trim_start())?;
    Some((name, parsed))
}

/// What the functions' errors are estimated with besides the samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct FunctionSpreadInputs {
    pub unseen: UnseenWeights,
    /// Shares of allocations (this interval's; for in-use, since start)
    /// no window looked at (sampler::spread::widen_for_unobserved).
    pub allocations_unobserved: f64,
    pub inuse_unobserved: f64,
}

/// Each emitted stack's functions as dense keys (by name, as `top`
/// groups them), for the functions' errors.
#[derive(Default)]
pub struct FunctionKeys {
    names: Vec<String>,
    key_of_name: FastHashMap<String, u32>,
    /// By pprof function id - 1: its name's key (u32::MAX: not yet known).
    key_of_function: Vec<u32>,
    /// Per stack: its leaf function's key, and where its distinct keys are
    /// in `arena`.
    stacks: FastHashMap<StackId, (u32, u32, u32)>,
    arena: Vec<u32>,
    /// More stacks than MAX_STACKS_WITH_ERRORS: no comments.
    overflowed: bool,
}

/// Stacks the functions' errors are worked out over at most: beyond it (only
/// with caps far above the defaults) a flush gives none, rather than hold
/// every stack's keys.
const MAX_STACKS_WITH_ERRORS: usize = 100_000;

impl FunctionKeys {
    fn key(&mut self, name: &str) -> u32 {
        if let Some(&key) = self.key_of_name.get(name) {
            return key;
        }
        let key = self.names.len() as u32;
        self.names.push(name.to_string());
        self.key_of_name.insert(name.to_string(), key);
        key
    }

    pub fn add_stack(
        &mut self,
        stack: StackId,
        location_ids: &[u64],
        profile: &crate::Profile,
        strings: &StringTable,
    ) {
        if self.overflowed || self.stacks.contains_key(&stack) {
            return;
        }
        if self.stacks.len() >= MAX_STACKS_WITH_ERRORS {
            self.overflowed = true;
            self.stacks = FastHashMap::default();
            self.arena = Vec::new();
            return;
        }
        let start = self.arena.len();
        for &id in location_ids {
            let function_id = profile
                .location
                .get((id as usize).wrapping_sub(1))
                .and_then(|location| location.line.first())
                .map_or(0, |line| line.function_id as usize);
            let index = function_id.wrapping_sub(1);
            let known = self.key_of_function.get(index).copied();
            let key = match known {
                Some(key) if key != u32::MAX => key,
                _ => {
                    let name = profile
                        .function
                        .get(index)
                        .and_then(|function| strings.get(function.name))
                        .unwrap_or("");
                    let key = self.key(name);
                    if index < profile.function.len() {
                        if self.key_of_function.len() <= index {
                            self.key_of_function.resize(index + 1, u32::MAX);
                        }
                        self.key_of_function[index] = key;
                    }
                    key
                }
            };
            self.arena.push(key);
        }
        let Some(&leaf) = self.arena.get(start) else {
            return;
        };
        let keys = &mut self.arena[start..];
        keys.sort_unstable();
        let mut len = 0;
        for i in 0..keys.len() {
            if i == 0 || keys[i] != keys[len - 1] {
                keys[len] = keys[i];
                len += 1;
            }
        }
        self.arena.truncate(start + len);
        self.stacks.insert(stack, (leaf, start as u32, len as u32));
    }

    /// The comments, over the samples of the stacks the build emitted (the
    /// first build of a flush: rows folded into "(other)" to keep within
    /// `max_samples` are left out, those folded to fit a size limit later
    /// are not; both are the smallest rows); with `class_leaf`, each
    /// sample's class is its leaf frame.
    pub fn comments(
        mut self,
        snapshot: &FlushSnapshot,
        classes: &FastHashMap<ClassRef, String>,
        class_leaf: bool,
        inputs: FunctionSpreadInputs,
        missed: Option<[f64; 4]>,
    ) -> Vec<String> {
        let mut class_keys: FastHashMap<ClassRef, u32> = FastHashMap::default();
        if class_leaf {
            for sample in &snapshot.samples {
                if let std::collections::hash_map::Entry::Vacant(entry) =
                    class_keys.entry(sample.class)
                {
                    let name = classes
                        .get(&sample.class)
                        .map(String::as_str)
                        .unwrap_or("(unknown class)");
                    entry.insert(self.key(name));
                }
            }
        }
        if self.overflowed {
            return vec![format!(
                "relative standard error of a function: not worked out (more than {MAX_STACKS_WITH_ERRORS} distinct stacks)"
            )];
        }
        let count = self.names.len();
        let (stacks, arena) = (&self.stacks, &self.arena);
        let flat = keyed_spreads(&snapshot.samples, inputs.unseen, count, |sample, keys| {
            if let Some((leaf, _, _)) = stacks.get(&sample.stack) {
                keys.push(class_keys.get(&sample.class).copied().unwrap_or(*leaf));
            }
        });
        let cum = keyed_spreads(&snapshot.samples, inputs.unseen, count, |sample, keys| {
            if let Some(&(_, start, len)) = stacks.get(&sample.stack) {
                let all = &arena[start as usize..(start + len) as usize];
                keys.extend_from_slice(all);
                if let Some(&class) = class_keys.get(&sample.class) {
                    if !all.contains(&class) {
                        keys.push(class);
                    }
                }
            }
        });
        let widen = |mut spreads: Vec<[Spread; 4]>| {
            for key_spreads in &mut spreads {
                let (allocated, inuse) = key_spreads.split_at_mut(2);
                widen_for_unobserved(allocated, inputs.allocations_unobserved);
                widen_for_unobserved(inuse, inputs.inuse_unobserved);
            }
            spreads
        };
        // The profile's totals: every sample, keyed or not, and the
        // allocations windows missed (a row of their own).
        let mut totals = missed.unwrap_or_default();
        for sample in &snapshot.samples {
            for (total, value) in totals.iter_mut().zip(sample.values) {
                *total += value;
            }
        }
        function_error_comments(&self.names, &widen(flat), &widen(cum), totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(flat: &[[Spread; 4]]) -> [f64; 4] {
        std::array::from_fn(|index| flat.iter().map(|s| s[index].total).sum())
    }

    fn spread(total: f64, rse: f64) -> Spread {
        Spread {
            total,
            variance: (rse * total).powi(2),
        }
    }

    #[test]
    fn comments_read_back_with_any_name() {
        let names = vec![
            "Foo#bar".to_string(),
            "block in <main> in x; y".to_string(),
            "unseen".to_string(),
        ];
        let zero = Spread::default();
        let flat = vec![
            [spread(100.0, 0.031), spread(4_000.0, 0.033), zero, zero],
            [zero, zero, spread(10.0, 0.25), spread(400.0, 0.5)],
            [zero; 4],
        ];
        let cum = vec![
            [spread(100.0, 0.02), spread(4_000.0, 0.021), zero, zero],
            [
                spread(5.0, 1.0),
                zero,
                spread(10.0, 0.25),
                spread(400.0, 0.5),
            ],
            [zero; 4],
        ];
        let comments = function_error_comments(&names, &flat, &cum, totals(&flat));
        assert_eq!(comments.len(), 2, "a function with no value gets none");
        assert_eq!(
            comments[0],
            "relative standard error of a function, flat and cum (%): alloc_objects 3.1 2.0 alloc_space 3.3 2.1 inuse_objects - - inuse_space - - in Foo#bar"
        );
        let parsed = parse_function_errors(&comments);
        let foo = parsed["Foo#bar"];
        assert_eq!(foo[0], [Some(0.031), Some(0.02)]);
        assert_eq!(foo[2], [None, None]);
        let odd = parsed["block in <main> in x; y"];
        assert_eq!(odd[0], [None, Some(1.0)]);
        assert_eq!(odd[3], [Some(0.5), Some(0.5)]);
    }

    /// 30 frames of a framework on every stack would fill the places by
    /// cum: they are left to the total's error, and the sites get theirs.
    #[test]
    fn the_spine_leaves_its_places_to_the_sites() {
        let mut names: Vec<String> = (0..30).map(|i| format!("Framework#layer{i}")).collect();
        names.extend(["A#render", "B#render", "String#*"].map(String::from));
        let zero = Spread::default();
        let mut flat = vec![[zero; 4]; 32];
        flat.push([spread(100.0, 0.05), zero, zero, zero]);
        let mut cum = vec![[spread(100.0, 0.05), zero, zero, zero]; 30];
        cum.push([spread(60.0, 0.1), zero, zero, zero]);
        cum.push([spread(40.0, 0.2), zero, zero, zero]);
        cum.push([spread(100.0, 0.05), zero, zero, zero]);
        let parsed =
            parse_function_errors(&function_error_comments(&names, &flat, &cum, totals(&flat)));
        let mut chosen: Vec<&str> = parsed.keys().map(String::as_str).collect();
        chosen.sort_unstable();
        assert_eq!(chosen, ["A#render", "B#render", "String#*"]);
        assert_eq!(parsed["B#render"][0], [None, Some(0.2)]);
        assert_eq!(parsed["String#*"][0], [Some(0.05), Some(0.05)]);
        // Measured against the profile's whole total (a missed-windows row
        // of 10 besides): the layers are below 99% of it, and leading.
        let mut whole = totals(&flat);
        whole[0] += 10.0;
        let parsed = parse_function_errors(&function_error_comments(&names, &flat, &cum, whole));
        assert!(parsed.contains_key("Framework#layer0"), "{parsed:?}");
        // No total: no function is the spine.
        let parsed = parse_function_errors(&function_error_comments(&names, &flat, &cum, [0.0; 4]));
        assert!(parsed.contains_key("Framework#layer0"), "{parsed:?}");
    }

    #[test]
    fn only_the_leading_functions_get_a_comment() {
        let n = 3 * FUNCTIONS_PER_VALUE;
        let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
        let flat: Vec<[Spread; 4]> = (0..n)
            .map(|i| {
                [
                    spread(1.0 + i as f64, 0.1),
                    Spread::default(),
                    Spread::default(),
                    Spread::default(),
                ]
            })
            .collect();
        let comments = function_error_comments(&names, &flat, &flat, totals(&flat));
        assert_eq!(comments.len(), FUNCTIONS_PER_VALUE);
        assert!(comments[0].ends_with(&format!(" in f{}", n - FUNCTIONS_PER_VALUE)));
    }

    /// Past MAX_STACKS_WITH_ERRORS distinct stacks the keys are dropped,
    /// and the profile says the errors were not worked out.
    #[test]
    #[cfg_attr(miri, ignore = "100,000 stacks: slow under Miri; no unsafe code")]
    fn too_many_stacks_give_a_comment_saying_so() {
        let mut strings = StringTable::new();
        let name = strings.intern("A#x");
        let mut profile = crate::Profile::default();
        profile.function.push(crate::Function {
            id: 1,
            name,
            ..Default::default()
        });
        profile.location.push(crate::Location {
            id: 1,
            line: vec![crate::Line {
                function_id: 1,
                line: 1,
                column: 0,
            }],
            ..Default::default()
        });
        let mut keys = FunctionKeys::default();
        for id in 0..=MAX_STACKS_WITH_ERRORS as u32 {
            keys.add_stack(
                StackId::from_stored(id).unwrap(),
                &[1, 1],
                &profile,
                &strings,
            );
        }
        assert!(keys.stacks.is_empty() && keys.arena.is_empty());
        let comments = keys.comments(
            &FlushSnapshot::default(),
            &FastHashMap::default(),
            false,
            FunctionSpreadInputs::default(),
            None,
        );
        assert_eq!(comments.len(), 1);
        assert!(comments[0].contains("not worked out"), "{comments:?}");
        assert!(is_function_error_comment(&comments[0]));
        assert!(parse_function_errors(&comments).is_empty());
    }

    #[test]
    fn malformed_or_repeated_comments_give_nothing() {
        let line = |name: &str, first: &str| {
            format!("{PREFIX}alloc_objects {first} 1.0 alloc_space 1.0 1.0 inuse_objects - - inuse_space - - in {name}")
        };
        let comments = vec![
            line("a", "NaN"),
            line("b", "-3"),
            line("c", "x"),
            format!("{PREFIX}alloc_objects 1.0 1.0 in d"),
            line("e", "2.0"),
            line("e", "3.0"),
            line("f", "4.0"),
            "something else".to_string(),
        ];
        let parsed = parse_function_errors(&comments);
        assert_eq!(parsed.len(), 1, "{parsed:?}");
        assert_eq!(parsed["f"][0][0], Some(0.04));
    }
}
