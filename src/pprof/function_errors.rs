//! How sure each of a profile's leading functions is, as comments: the
//! relative standard error of its flat and cum values.
//!
//! The total's error (spread_comment.rs) says little of a function's: a
//! function that allocates in runs (a loop in one request) is met by a few
//! windows or by none, and its value spreads by how many windows met it,
//! many times what its share of the samples suggests. So the flush
//! estimates each function's spread as the total's is, over its own values
//! (sampler::spread::keyed_spreads), for the functions a reader looks at
//! first (the leading ones by flat or cum of each value), one comment each:
//!
//!   relative standard error of a function, flat and cum (%): alloc_objects 3.1 2.0 alloc_space 3.3 2.1 inuse_objects - 5.0 inuse_space - 8.0 in Foo#bar
//!
//! "-" where the function has no such value. The name comes last, so any
//! name reads back whole.

use crate::fast_hash::FastHashMap;
use crate::sampler::spread::Spread;

use super::spread_comment::VALUE_NAMES;

const PREFIX: &str = "relative standard error of a function, flat and cum (%): ";
const NAME_SEPARATOR: &str = " in ";

/// The leading functions by each value, flat and cum, that get a comment.
pub const FUNCTIONS_PER_VALUE: usize = 20;

/// One function's relative standard errors: [value type][flat, cum]
/// (None: no such value).
pub type FunctionErrors = [[Option<f64>; 2]; 4];

/// The comments for the functions worth one: `names[k]` is key k's name,
/// `flat[k]` and `cum[k]` its spreads.
pub fn function_error_comments(
    names: &[String],
    flat: &[[Spread; 4]],
    cum: &[[Spread; 4]],
) -> Vec<String> {
    let mut chosen = vec![false; names.len()];
    for spreads in [flat, cum] {
        for index in 0..4 {
            let mut keys: Vec<usize> = (0..spreads.len().min(names.len()))
                .filter(|&k| spreads[k][index].total > 0.0)
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

/// The errors the comments give, by function name (a profile without them
/// gives none; a name given twice, as merged profiles would, is left out:
/// which profile's it is cannot be told).
pub fn parse_function_errors<S: AsRef<str>>(comments: &[S]) -> FastHashMap<String, FunctionErrors> {
    let mut errors = FastHashMap::default();
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let comments = function_error_comments(&names, &flat, &cum);
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
        let comments = function_error_comments(&names, &flat, &flat);
        assert_eq!(comments.len(), FUNCTIONS_PER_VALUE);
        assert!(comments[0].ends_with(&format!(" in f{}", n - FUNCTIONS_PER_VALUE)));
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
