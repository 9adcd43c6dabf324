//! The profile comment that says how sure each total is, written at a flush
//! and read back by the CLI: one line, one part per sample type, e.g.
//!
//! ```text
//! relative standard error of each total: alloc_objects ±3.1% (1040 effective samples); alloc_space ±3.4% (870 effective samples); inuse_objects ±0.0% (exact); inuse_space unknown (no samples)
//! ```

use sampler::spread::Spread;

const PREFIX: &str = "relative standard error of each total: ";
/// The four values' names, in the profile's order (heap_profile's
/// SAMPLE_TYPES).
pub const VALUE_NAMES: [&str; 4] = [
    "alloc_objects",
    "alloc_space",
    "inuse_objects",
    "inuse_space",
];

/// How sure one total is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TotalSpread {
    /// Estimated: the relative standard error, and the effective samples.
    Estimated { rse: f64, effective_samples: f64 },
    /// Every object was sampled.
    Exact,
    /// No sample to tell from.
    NoSamples,
    /// Sampling windows hooked none of the interval's allocations.
    NothingHooked,
}

impl TotalSpread {
    /// The relative standard error and the effective samples (infinite
    /// when exact); None for both where they cannot be known.
    pub fn figures(self) -> (Option<f64>, Option<f64>) {
        match self {
            TotalSpread::Estimated {
                rse,
                effective_samples,
            } => (Some(rse), Some(effective_samples)),
            TotalSpread::Exact => (Some(0.0), Some(f64::INFINITY)),
            TotalSpread::NoSamples | TotalSpread::NothingHooked => (None, None),
        }
    }
}

/// What a flush's four spreads say. `nothing_hooked`: sampling windows
/// left every allocation of the interval unhooked, so alloc_* are unknown.
pub fn total_spreads(spreads: &[Spread; 4], nothing_hooked: bool) -> [TotalSpread; 4] {
    let mut index = 0;
    spreads.map(|spread| {
        let allocations = index < 2;
        index += 1;
        if allocations && nothing_hooked {
            return TotalSpread::NothingHooked;
        }
        match (spread.relative_standard_error(), spread.effective_samples()) {
            (Some(rse), Some(effective)) if effective.is_finite() => TotalSpread::Estimated {
                rse,
                effective_samples: effective,
            },
            (Some(_), Some(_)) => TotalSpread::Exact,
            _ => TotalSpread::NoSamples,
        }
    })
}

/// The comment for a flush's four totals.
pub fn format_spread_comment(totals: &[TotalSpread; 4]) -> String {
    let parts: Vec<String> = VALUE_NAMES
        .iter()
        .zip(totals)
        .map(|(name, &total)| format!("{name} {}", describe(total)))
        .collect();
    format!("{PREFIX}{}", parts.join("; "))
}

fn describe(total: TotalSpread) -> String {
    match total {
        TotalSpread::Estimated {
            rse,
            effective_samples,
        } => format!(
            "±{:.1}% ({:.0} effective samples)",
            rse * 100.0,
            effective_samples
        ),
        TotalSpread::Exact => "±0.0% (exact)".into(),
        TotalSpread::NoSamples => "unknown (no samples)".into(),
        TotalSpread::NothingHooked => "unknown (no allocation hooked)".into(),
    }
}

/// The spread of `sample_type`'s total, if a comment says it.
pub fn parse_spread_comment<'a>(
    comments: impl IntoIterator<Item = &'a str>,
    sample_type: &str,
) -> Option<TotalSpread> {
    let line = comments.into_iter().find_map(|c| c.strip_prefix(PREFIX))?;
    let part = line
        .split("; ")
        .find_map(|part| part.strip_prefix(sample_type)?.strip_prefix(' '))?;
    match part {
        "±0.0% (exact)" => Some(TotalSpread::Exact),
        "unknown (no samples)" => Some(TotalSpread::NoSamples),
        "unknown (no allocation hooked)" => Some(TotalSpread::NothingHooked),
        _ => {
            let (rse, rest) = part.strip_prefix('±')?.split_once("% (")?;
            let effective = rest.strip_suffix(" effective samples)")?;
            Some(TotalSpread::Estimated {
                rse: rse
                    .parse::<f64>()
                    .ok()
                    .filter(|r| r.is_finite() && *r >= 0.0)?
                    / 100.0,
                effective_samples: effective.parse::<f64>().ok().filter(|e| e.is_finite())?,
            })
        }
    }
}

/// One line for a report on `sample_type`, if the profile says how sure it is.
pub fn spread_line<'a>(
    comments: impl IntoIterator<Item = &'a str>,
    sample_type: &str,
) -> Option<String> {
    Some(match parse_spread_comment(comments, sample_type)? {
        TotalSpread::Estimated {
            rse,
            effective_samples,
        } => format!(
            "Estimate: total within ±{:.1}% (one relative standard error; {:.0} effective samples)",
            rse * 100.0,
            effective_samples
        ),
        TotalSpread::Exact => "Estimate: exact (every object sampled)".into(),
        TotalSpread::NoSamples => "Estimate: no samples, so the total is unknown, not zero".into(),
        TotalSpread::NothingHooked => {
            "Estimate: unknown: sampling windows hooked none of this interval's allocations, so 0 means not looked".into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comment_reads_back_what_was_written() {
        let spreads = [
            Spread {
                total: 1_000.0,
                variance: 100.0,
            },
            Spread {
                total: 40_000.0,
                variance: 0.0,
            },
            Spread::default(),
            Spread {
                total: 10.0,
                variance: 1.0,
            },
        ];
        let comment = format_spread_comment(&total_spreads(&spreads, false));
        let read = |t| parse_spread_comment([comment.as_str()], t);
        assert_eq!(
            read("alloc_objects"),
            Some(TotalSpread::Estimated {
                rse: 0.01,
                effective_samples: 10_000.0
            })
        );
        assert_eq!(read("alloc_space"), Some(TotalSpread::Exact));
        assert_eq!(read("inuse_objects"), Some(TotalSpread::NoSamples));
        assert_eq!(
            read("inuse_space"),
            Some(TotalSpread::Estimated {
                rse: 0.1,
                effective_samples: 100.0
            })
        );
        assert_eq!(read("cpu"), None);
        assert_eq!(
            read("alloc_space").unwrap().figures(),
            (Some(0.0), Some(f64::INFINITY))
        );
        let unhooked = format_spread_comment(&total_spreads(&spreads, true));
        assert_eq!(
            parse_spread_comment([unhooked.as_str()], "alloc_space"),
            Some(TotalSpread::NothingHooked)
        );
        assert!(spread_line([unhooked.as_str()], "alloc_objects")
            .unwrap()
            .contains("0 means not looked"));
        assert_eq!(spread_line(["other comment"], "alloc_objects"), None);
    }

    #[test]
    fn a_crafted_comment_is_ignored_not_misread() {
        for bad in [
            "relative standard error of each total: alloc_objects ±NaN% (3 effective samples)",
            "relative standard error of each total: alloc_objects ±-1% (3 effective samples)",
            "relative standard error of each total: alloc_objects ±1%",
            "relative standard error of each total: alloc_objects",
        ] {
            assert_eq!(parse_spread_comment([bad], "alloc_objects"), None, "{bad}");
        }
    }
}
