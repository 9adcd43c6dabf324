//! `top`: the table `go tool pprof -top` prints, in units a person reads,
//! grouped by function, line, class, file or gem.

use std::fmt::Write;

use super::decoded_profile::DecodedProfile;
use super::display::{rank, shown};
use super::grouping::{frame_label, FrameGroups, GroupBy, PathShortener};
use super::units::{format_duration, format_percent, format_time_utc, format_value};
use crate::{InputMap, InputSet};
use pprof::function_errors::{parse_function_errors, FunctionErrors, SPINE_FALLBACK_SHARE};
use pprof::heap_profile::SAMPLE_TYPES;
use pprof::spread_comment::{parse_spread_comment, spread_line, TotalSpread};

#[derive(Debug, Clone)]
pub struct TopOptions {
    /// Sample type name; `None` takes the profile's default.
    pub sample_type: Option<String>,
    pub by: GroupBy,
    /// Rows shown; 0 shows all.
    pub limit: usize,
    /// Only samples with a frame in this set (frame indices) count.
    pub focus: Option<InputSet<u32>>,
    /// What the focus was, for the header ("/PageCache/").
    pub focus_description: String,
    pub sort_by_cum: bool,
    /// Paths under it are shown relative to it.
    pub base_dir: String,
    /// Shown as `File:` in the header (usually the file name).
    pub title: String,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            sample_type: None,
            by: GroupBy::Function,
            limit: 20,
            focus: None,
            focus_description: String::new(),
            sort_by_cum: false,
            base_dir: String::new(),
            title: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRow {
    pub label: String,
    /// Where the row is the leaf (for a class: all of its samples).
    pub flat: i64,
    /// Where the row is anywhere on the stack (counted once per sample).
    pub cum: i64,
}

#[derive(Debug, Clone)]
pub struct TopTable {
    pub sample_type: String,
    pub unit: String,
    /// The rows shown (`limit` of them, or all), sorted.
    pub rows: Vec<TopRow>,
    /// How many rows have a value (shown or not).
    pub row_count: usize,
    /// Sum over the samples that count (all, or the focused ones).
    pub total: i64,
    /// Sum over all samples (differs from `total` with a focus).
    pub profile_total: i64,
    pub samples_counted: usize,
}

/// Whether sample `sample` passes the focus (has a frame in it).
pub(crate) fn in_focus(
    profile: &DecodedProfile,
    sample: usize,
    focus: &Option<InputSet<u32>>,
) -> bool {
    let Some(focus) = focus else {
        return true;
    };
    profile.sample_locations[sample].iter().any(|location| {
        profile.location_frames[*location as usize]
            .iter()
            .any(|frame| focus.contains(frame))
    })
}

/// The class label of a sample, as a row label (see `display::shown`).
pub(crate) fn class_label(profile: &DecodedProfile, sample: usize) -> String {
    match profile.sample_class[sample] {
        Some(class) => shown(profile.string(class)).into_owned(),
        None => "(no class label)".to_string(),
    }
}

pub fn top_table(profile: &DecodedProfile, options: &TopOptions) -> Result<TopTable, String> {
    let index = profile.sample_index(options.sample_type.as_deref())?;
    let (sample_type, unit) = profile.sample_types().swap_remove(index);
    let paths = PathShortener::new(&options.base_dir);

    let mut total = 0i64;
    let mut profile_total = 0i64;
    let mut samples_counted = 0usize;
    let groups = options
        .by
        .is_per_frame()
        .then(|| FrameGroups::new(profile, &options.by, &paths));
    // Per sample, the string index of the label grouped by (class or a
    // context label), when rows are not frames.
    let sample_labels = match &options.by {
        GroupBy::Label(key) => {
            let values = profile.sample_label_values(key);
            if values.iter().all(Option::is_none) {
                return Err(profile.missing_label(key));
            }
            values
        }
        _ => profile.sample_class.clone(),
    };
    // (flat, cum) by group: a frame group, or a label's string index
    // (the last slot: samples without one). Both are dense, so a Vec.
    const NO_CLASS: u32 = u32::MAX;
    let slots = match &groups {
        Some(groups) => groups.representative.len(),
        None => profile.raw.string_table.len() + 1,
    };
    let mut values: Vec<(i64, i64)> = vec![(0, 0); slots];
    let mut add = |group: u32, flat: i64, cum: i64| {
        let index = if group == NO_CLASS {
            slots - 1
        } else {
            group as usize
        };
        let slot = &mut values[index];
        slot.0 = slot.0.saturating_add(flat);
        slot.1 = slot.1.saturating_add(cum);
    };
    let mut on_stack: Vec<u32> = Vec::new();
    let mut on_locations: Vec<u32> = Vec::new();
    for (sample, value) in profile.values(index).enumerate() {
        profile_total = profile_total.saturating_add(value);
        if value == 0 || !in_focus(profile, sample, &options.focus) {
            continue;
        }
        total = total.saturating_add(value);
        samples_counted += 1;
        let Some(groups) = &groups else {
            add(sample_labels[sample].unwrap_or(u32::MAX), value, value);
            continue;
        };
        // Each group once per sample. Distinct locations first: a stack
        // can repeat a location of many inlined frames thousands of times
        // (recursion, or a crafted file), and only its groups matter.
        let locations = &profile.sample_locations[sample];
        let leaf = locations
            .first()
            .and_then(|l| profile.location_frames[*l as usize].first())
            .map(|frame| groups.of_frame[*frame as usize]);
        on_locations.clear();
        on_locations.extend_from_slice(locations);
        on_locations.sort_unstable();
        on_locations.dedup();
        on_stack.clear();
        on_stack.extend(
            on_locations
                .iter()
                .flat_map(|l| profile.location_frames[*l as usize].iter())
                .map(|frame| groups.of_frame[*frame as usize]),
        );
        on_stack.sort_unstable();
        on_stack.dedup();
        for &group in &on_stack {
            add(group, if Some(group) == leaf { value } else { 0 }, value);
        }
    }

    let rows: Vec<(u32, (i64, i64))> = values
        .into_iter()
        .enumerate()
        .filter(|(_, (flat, cum))| *flat != 0 || *cum != 0)
        .map(|(index, sums)| {
            let group = if groups.is_none() && index == slots - 1 {
                NO_CLASS
            } else {
                index as u32
            };
            (group, sums)
        })
        .collect();
    let row_count = rows.len();
    let label = |(group, _): &(u32, (i64, i64))| match &groups {
        Some(groups) => {
            let frame = groups.representative[*group as usize];
            frame_label(
                profile,
                &profile.frames[frame as usize],
                &options.by,
                &paths,
            )
        }
        None if *group == NO_CLASS => options.by.unlabelled_row(),
        None => shown(profile.string(*group)).into_owned(),
    };
    let ranked = if options.sort_by_cum {
        rank(rows, options.limit, |(_, (flat, cum))| (*cum, *flat), label)
    } else {
        rank(rows, options.limit, |(_, (flat, cum))| (*flat, *cum), label)
    };
    Ok(TopTable {
        sample_type,
        unit,
        rows: ranked
            .into_iter()
            .map(|((_, (flat, cum)), label)| TopRow { label, flat, cum })
            .collect(),
        row_count,
        total,
        profile_total,
        samples_counted,
    })
}

/// The header lines every report starts with: file, type, time, sampling.
pub(crate) fn header(
    profile: &DecodedProfile,
    title: &str,
    sample_type: &str,
    unit: &str,
) -> String {
    let mut out = String::new();
    if !title.is_empty() {
        let _ = writeln!(out, "File: {title}");
    }
    let _ = writeln!(out, "Type: {} ({})", shown(sample_type), shown(unit));
    if profile.raw.time_nanos > 0 {
        let _ = write!(out, "Time: {}", format_time_utc(profile.raw.time_nanos));
        if profile.raw.duration_nanos > 0 {
            let _ = write!(
                out,
                ", covering {}",
                format_duration(profile.raw.duration_nanos)
            );
        }
        out.push('\n');
    }
    if profile
        .comments()
        .iter()
        .any(|c| c.starts_with("memprofiler_pprof_rs:"))
        && profile.raw.period > 1
    {
        let _ = writeln!(
            out,
            "Sampling: 1 in {} objects on average; values are estimates",
            profile.raw.period
        );
    }
    if let Some(line) = spread_line(profile.comments(), sample_type) {
        let _ = writeln!(out, "{line}");
    }
    out
}

pub fn render_top(profile: &DecodedProfile, options: &TopOptions) -> Result<String, String> {
    let table = top_table(profile, options)?;
    let mut out = header(profile, &options.title, &table.sample_type, &table.unit);
    if options.focus.is_some() {
        let _ = writeln!(
            out,
            "Focus: {} matches {} of {} ({})",
            options.focus_description,
            format_value(table.total, &table.unit),
            format_value(table.profile_total, &table.unit),
            format_percent(table.total, table.profile_total)
        );
    }
    if table.rows.is_empty() {
        let _ = writeln!(
            out,
            "No samples with {} {}.",
            shown(&table.sample_type),
            if options.focus.is_some() {
                "match the focus"
            } else {
                "in this profile"
            }
        );
        return Ok(out);
    }
    let shown = table.rows.len();
    let shown_flat = table.rows[..shown]
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.flat));
    // Percentages are of the whole profile, focus or not, as go tool pprof
    // shows them (its relative_percentages is off by default).
    let whole = table.profile_total;
    let _ = writeln!(
        out,
        "Showing {shown} of {} {}: {} of {} total ({})",
        table.row_count,
        options.by.plural(),
        format_value(shown_flat, &table.unit),
        format_value(whole, &table.unit),
        format_percent(shown_flat, whole)
    );

    let formatted: Vec<(String, String)> = table.rows[..shown]
        .iter()
        .map(|r| {
            (
                format_value(r.flat, &table.unit),
                format_value(r.cum, &table.unit),
            )
        })
        .collect();
    let width = formatted
        .iter()
        .flat_map(|(f, c)| [f.chars().count(), c.chars().count()])
        .max()
        .unwrap_or(0)
        .max(4);
    let per_frame = options.by.is_per_frame();
    let errors = row_errors(profile, options, &table.sample_type);
    let total_error = match parse_spread_comment(profile.comments(), &table.sample_type) {
        Some(TotalSpread::Estimated { rse, .. }) => Some(rse),
        Some(TotalSpread::Exact) => Some(0.0),
        _ => None,
    };
    if errors.is_some() {
        let _ = writeln!(
            out,
            "±: the row's relative standard error, as the profile gives it for its leading functions (the total's for rows of nearly all of it)"
        );
    }
    let _ = write!(out, "{:>width$} {:>6} {:>6}", "flat", "flat%", "sum%");
    if errors.is_some() {
        let _ = write!(out, " {:>6}", "±");
    }
    if per_frame {
        let _ = write!(out, " {:>width$} {:>6}", "cum", "cum%");
        if errors.is_some() {
            let _ = write!(out, " {:>6}", "±");
        }
    }
    out.push('\n');
    let mut sum = 0i64;
    for (row, (flat, cum)) in table.rows[..shown].iter().zip(&formatted) {
        sum = sum.saturating_add(row.flat);
        let _ = write!(
            out,
            "{flat:>width$} {:>6} {:>6}",
            format_percent(row.flat, whole),
            format_percent(sum, whole)
        );
        let row_error = |which: usize, value: i64| -> String {
            let given = errors
                .as_ref()
                .and_then(|(by_name, index)| by_name.get(&row.label)?[*index][which]);
            // A row of nearly everything (the spine) has the total's error.
            let spine = value as f64 >= SPINE_FALLBACK_SHARE * whole as f64;
            given
                .or(total_error.filter(|_| spine))
                .filter(|_| value > 0)
                .map(|rse| format!("±{:.0}%", 100.0 * rse))
                .unwrap_or_default()
        };
        if errors.is_some() {
            let _ = write!(out, " {:>6}", row_error(0, row.flat));
        }
        if per_frame {
            let _ = write!(out, " {cum:>width$} {:>6}", format_percent(row.cum, whole));
            if errors.is_some() {
                let _ = write!(out, " {:>6}", row_error(1, row.cum));
            }
        }
        let _ = writeln!(out, "  {}", row.label);
    }
    Ok(out)
}

/// The functions' errors the profile gives, by row label, and the value
/// type's index among them: only for rows by function over every sample
/// (a focus or another grouping makes other rows).
fn row_errors(
    profile: &DecodedProfile,
    options: &TopOptions,
    sample_type: &str,
) -> Option<(InputMap<String, FunctionErrors>, usize)> {
    if options.by != GroupBy::Function || options.focus.is_some() {
        return None;
    }
    let index = SAMPLE_TYPES
        .iter()
        .position(|(name, _)| *name == sample_type)?;
    // By the label a row shows: names cut short alike are one label, and
    // which one's error it is cannot be told.
    let mut errors: InputMap<String, FunctionErrors> = InputMap::default();
    let mut ambiguous = Vec::new();
    for (name, function) in parse_function_errors(&profile.comments()) {
        let label = shown(&name).into_owned();
        if errors.insert(label.clone(), function).is_some() {
            ambiguous.push(label);
        }
    }
    for label in ambiguous {
        errors.remove(&label);
    }
    (!errors.is_empty()).then_some((errors, index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoded_profile::tests::profile_from;

    fn leaky() -> DecodedProfile {
        let raw = profile_from(
            &[("alloc_space", "bytes"), ("inuse_space", "bytes")],
            &[
                (
                    &[
                        ("String#*", "/srv/app/a.rb", 3),
                        ("A#render", "/srv/app/a.rb", 3),
                        ("A#run", "/srv/app/a.rb", 9),
                    ],
                    &[3_000_000, 2_000_000],
                    Some("String"),
                ),
                (
                    &[
                        ("Array#map", "/srv/app/a.rb", 4),
                        ("A#render", "/srv/app/a.rb", 4),
                        ("A#run", "/srv/app/a.rb", 9),
                    ],
                    &[1_000_000, 0],
                    Some("Array"),
                ),
                (
                    &[
                        (
                            "Hash#[]=",
                            "/var/lib/gems/3.1.0/gems/rack-2.2.0/lib/rack/utils.rb",
                            20,
                        ),
                        ("A#run", "/srv/app/a.rb", 10),
                    ],
                    &[500_000, 500_000],
                    Some("Hash"),
                ),
                // Recursion: A#run twice on one stack counts once in cum.
                (
                    &[
                        ("A#run", "/srv/app/a.rb", 12),
                        ("A#run", "/srv/app/a.rb", 12),
                    ],
                    &[100_000, 0],
                    None,
                ),
            ],
        );
        DecodedProfile::from_raw(raw).unwrap()
    }

    fn options(by: GroupBy, sample_type: &str) -> TopOptions {
        TopOptions {
            sample_type: Some(sample_type.to_string()),
            by,
            base_dir: "/srv/app".to_string(),
            title: "heap.pprof".to_string(),
            ..TopOptions::default()
        }
    }

    #[test]
    fn flat_and_cum_by_function() {
        let table = top_table(&leaky(), &options(GroupBy::Function, "alloc_space")).unwrap();
        assert_eq!(table.total, 4_600_000);
        let row = |name: &str| table.rows.iter().find(|r| r.label == name).unwrap().clone();
        assert_eq!(row("String#*").flat, 3_000_000);
        assert_eq!(row("A#render").flat, 0);
        assert_eq!(row("A#render").cum, 4_000_000);
        assert_eq!(row("A#run").cum, 4_600_000, "recursion is counted once");
        assert_eq!(row("A#run").flat, 100_000);
        assert_eq!(table.rows[0].label, "String#*");
    }

    #[test]
    fn other_groupings() {
        let profile = leaky();
        let gems = top_table(&profile, &options(GroupBy::Gem, "alloc_space")).unwrap();
        let labels: Vec<(&str, i64)> = gems
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.flat))
            .collect();
        assert_eq!(labels, [("(app)", 4_100_000), ("rack", 500_000)]);
        let classes = top_table(&profile, &options(GroupBy::Class, "inuse_space")).unwrap();
        let labels: Vec<(&str, i64)> = classes
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.flat))
            .collect();
        assert_eq!(labels, [("String", 2_000_000), ("Hash", 500_000)]);
        let lines = top_table(&profile, &options(GroupBy::Line, "alloc_space")).unwrap();
        assert_eq!(lines.rows[0].label, "String#* a.rb:3");
        let files = top_table(&profile, &options(GroupBy::File, "alloc_space")).unwrap();
        assert_eq!(files.rows[1].label, "rack-2.2.0/lib/rack/utils.rb");
    }

    /// Rows by function show the errors the profile gives for them; other
    /// groupings and a focus make other rows, and show none.
    #[test]
    fn rows_by_function_show_the_profiles_errors() {
        let mut raw = leaky().raw;
        let comment = "relative standard error of a function, flat and cum (%): alloc_objects - - alloc_space 5.0 25.0 inuse_objects - - inuse_space - - in A#render";
        let totals = "relative standard error of each total: alloc_space ±3.0% (1000 effective samples); inuse_space ±4.0% (600 effective samples)";
        for line in [comment, totals] {
            raw.string_table.push(line.to_string());
            raw.comment.push(raw.string_table.len() as i64 - 1);
        }
        let profile = DecodedProfile::from_raw(raw).unwrap();
        let text = render_top(&profile, &options(GroupBy::Function, "alloc_space")).unwrap();
        let row = |name: &str| {
            text.lines()
                .find(|l| l.ends_with(&format!("  {name}")))
                .unwrap_or_else(|| panic!("{name} in {text}"))
                .to_string()
        };
        // A#render has no flat value: only its cum error shows.
        assert!(
            row("A#render").contains("100.0%        3.81 MB  87.0%   ±25%"),
            "{text}"
        );
        assert!(!row("String#*").contains('±'), "{text}");
        // A#run is on every stack: the total's error is its cum's.
        assert!(row("A#run").contains("100.0%    ±3%  A#run"), "{text}");
        assert!(
            text.contains("±: the row's relative standard error"),
            "{text}"
        );
        let lines = render_top(&profile, &options(GroupBy::Line, "alloc_space")).unwrap();
        assert!(
            lines
                .lines()
                .filter(|l| l.contains('±'))
                .all(|l| l.starts_with("Estimate:")),
            "{lines}"
        );
        let inuse = render_top(&profile, &options(GroupBy::Function, "inuse_space")).unwrap();
        assert!(inuse.contains("±: the row's"), "{inuse}");
        assert!(
            !inuse
                .lines()
                .any(|l| l.ends_with("A#render") && l.contains("±2")),
            "{inuse}"
        );
    }

    #[test]
    fn focus_keeps_samples_through_a_frame() {
        let profile = leaky();
        let focus: InputSet<u32> = profile
            .frames
            .iter()
            .enumerate()
            .filter(|(_, f)| profile.string(f.name) == "Array#map")
            .map(|(i, _)| i as u32)
            .collect();
        let mut options = options(GroupBy::Function, "alloc_space");
        options.focus = Some(focus);
        options.focus_description = "/map/".to_string();
        let table = top_table(&profile, &options).unwrap();
        assert_eq!(table.total, 1_000_000);
        assert_eq!(table.profile_total, 4_600_000);
        let text = render_top(&profile, &options).unwrap();
        // Percentages are of the whole profile (as go tool pprof shows them).
        assert!(
            text.contains("977 kB  21.7%  21.7% 977 kB  21.7%  Array#map"),
            "{text}"
        );
        assert!(
            text.contains("Focus: /map/ matches 977 kB of 4.39 MB (21.7%)"),
            "{text}"
        );
    }

    #[test]
    fn rendered_table() {
        let text = render_top(&leaky(), &options(GroupBy::Function, "inuse_space")).unwrap();
        let expected = "\
File: heap.pprof
Type: inuse_space (bytes)
Showing 4 of 4 functions: 2.38 MB of 2.38 MB total (100.0%)
   flat  flat%   sum%     cum   cum%
1.91 MB  80.0%  80.0% 1.91 MB  80.0%  String#*
 488 kB  20.0% 100.0%  488 kB  20.0%  Hash#[]=
    0 B   0.0% 100.0% 2.38 MB 100.0%  A#run
    0 B   0.0% 100.0% 1.91 MB  80.0%  A#render
";
        assert_eq!(text, expected);
    }

    #[test]
    fn empty_and_unknown_sample_type() {
        let profile = leaky();
        let mut options = options(GroupBy::Function, "inuse_space");
        options.focus = Some(InputSet::default());
        options.focus_description = "/nothing/".to_string();
        let text = render_top(&profile, &options).unwrap();
        assert!(
            text.ends_with("No samples with inuse_space match the focus.\n"),
            "{text}"
        );
        let error = render_top(&profile, &self::options(GroupBy::Function, "cpu")).unwrap_err();
        assert!(error.contains("no sample type \"cpu\""), "{error}");
    }
}
