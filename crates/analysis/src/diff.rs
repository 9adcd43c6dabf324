//! `diff`: what grew between profiles of one process — by allocation site
//! (whole stack), by allocating method and by class — sorted by growth,
//! with a verdict line naming the site that grew most. Given more than two
//! profiles it also counts, per row, in how many intervals the row grew:
//! a leak grows in every one, noise does not.

use std::fmt::Write;

use super::decoded_profile::{DecodedProfile, FrameInfo};
use super::display::{rank, shown};
use super::grouping::{describe_site, PathShortener};
use super::growth_test::{
    beyond_error, ends_apart, never_falls, rises_steadily, standard_error, total_errors,
};
use super::top::class_label;
use super::units::{format_percent, format_signed, format_value};
use crate::InputMap;
use pprof::function_errors::parse_function_errors;
use pprof::heap_profile::SAMPLE_TYPES;
use pprof::inuse_comment::settled_gc;
use pprof::process_comment::processes_named;
use sampler::fast_hash::FastHashMap;

#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Sample type; `None` takes inuse_space when every profile has it,
    /// otherwise the first profile's default.
    pub sample_type: Option<String>,
    /// Rows per section; 0 shows every row that grew.
    pub limit: usize,
    pub base_dir: String,
    /// One per profile (usually file names).
    pub titles: Vec<String>,
    /// A label key (`endpoint`): adds a section by its values and a verdict
    /// line naming the value that grew most.
    pub by_label: Option<String>,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            sample_type: None,
            limit: 10,
            base_dir: String::new(),
            titles: Vec::new(),
            by_label: None,
        }
    }
}

/// One row: its values in each profile, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowthRow {
    pub label: String,
    /// For stacks: the callers, innermost first, to show under the label.
    pub context: Vec<String>,
    pub values: Vec<i64>,
}

impl GrowthRow {
    pub fn growth(&self) -> i64 {
        let last = self.values.last().copied().unwrap_or(0);
        last.saturating_sub(self.values.first().copied().unwrap_or(0))
    }

    /// In how many consecutive pairs the value went up.
    pub fn intervals_up(&self) -> usize {
        self.values.windows(2).filter(|w| w[1] > w[0]).count()
    }
}

/// One section of the report: the rows that grew, ranked (as many as
/// asked for), and how many grew in all.
#[derive(Debug, Clone)]
pub struct Section {
    pub rows: Vec<GrowthRow>,
    pub growing: usize,
}

#[derive(Debug, Clone)]
pub struct Diff {
    pub sample_type: String,
    pub unit: String,
    pub totals: Vec<i64>,
    pub by_stack: Section,
    pub by_method: Section,
    pub by_class: Section,
    /// With `by_label`: the key, its section, and what it says.
    pub by_label: Option<(String, Section, String)>,
    pub verdict: String,
}

/// A row while values are added up: its value in each profile, and where
/// it was first seen (profile, sample), to describe it if it is shown.
struct Tally {
    values: Vec<i64>,
    seen_at: (usize, usize),
}

impl Tally {
    fn growth(&self) -> i64 {
        let last = self.values.last().copied().unwrap_or(0);
        last.saturating_sub(self.values.first().copied().unwrap_or(0))
    }
}

/// Rows keyed by ids this module gives (nobody else's choice, so FxHash),
/// each with one value slot per profile.
struct Accumulator<K> {
    rows: FastHashMap<K, Tally>,
    profiles: usize,
}

impl<K: std::hash::Hash + Eq> Accumulator<K> {
    fn new(profiles: usize) -> Self {
        Accumulator {
            rows: FastHashMap::default(),
            profiles,
        }
    }

    fn add(&mut self, key: K, profile: usize, sample: usize, value: i64) {
        let profiles = self.profiles;
        let row = self.rows.entry(key).or_insert_with(|| Tally {
            values: vec![0; profiles],
            seen_at: (profile, sample),
        });
        row.values[profile] = row.values[profile].saturating_add(value);
    }

    /// The rows that grew, ranked by growth (ties by label), `limit` of
    /// them (all if 0); `describe` gives a row's label and context, and is
    /// asked only for the rows shown (see `display::rank`).
    fn section(
        self,
        limit: usize,
        describe: &mut dyn FnMut((usize, usize)) -> (String, Vec<String>),
    ) -> Section {
        let growing: Vec<Tally> = self.rows.into_values().filter(|t| t.growth() > 0).collect();
        Section {
            growing: growing.len(),
            rows: ranked(growing, limit, describe),
        }
    }
}

fn ranked(
    tallies: Vec<Tally>,
    limit: usize,
    describe: &mut dyn FnMut((usize, usize)) -> (String, Vec<String>),
) -> Vec<GrowthRow> {
    // Ranked by label, then by context (both describe the row).
    rank(tallies, limit, Tally::growth, |tally| {
        describe(tally.seen_at)
    })
    .into_iter()
    .map(|(tally, (label, context))| GrowthRow {
        label,
        context,
        values: tally.values,
    })
    .collect()
}

/// The sample type a diff compares, by name, in every profile.
fn pick_sample_type(
    profiles: &[&DecodedProfile],
    wanted: Option<&str>,
    titles: &[String],
) -> Result<String, String> {
    let name = match wanted {
        Some(name) => name.to_string(),
        None => {
            let every_has_inuse = profiles
                .iter()
                .all(|p| p.sample_types().iter().any(|(t, _)| t == "inuse_space"));
            if every_has_inuse {
                "inuse_space".to_string()
            } else {
                let first = profiles[0];
                first
                    .sample_types()
                    .swap_remove(first.sample_index(None)?)
                    .0
            }
        }
    };
    for (position, profile) in profiles.iter().enumerate() {
        profile.sample_index(Some(&name)).map_err(|error| {
            let title = titles
                .get(position)
                .cloned()
                .unwrap_or_else(|| format!("profile {}", position + 1));
            format!("{title}: {error}")
        })?;
    }
    Ok(name)
}

/// Strings of several profiles as one set of ids: each profile has its own
/// string table, and the same name must be one key across them. Each
/// distinct string is hashed once per profile, never copied.
struct SharedStrings<'p> {
    ids: InputMap<&'p str, u32>,
}

impl<'p> SharedStrings<'p> {
    /// The shared id of each string index of `profile` that `indexes` asks
    /// for, memoized in `memo` (one slot per string index).
    fn id(
        &mut self,
        profile: &'p DecodedProfile,
        memo: &mut InputMap<u32, u32>,
        index: u32,
    ) -> u32 {
        *memo.entry(index).or_insert_with(|| {
            let next = self.ids.len() as u32;
            *self.ids.entry(profile.string(index)).or_insert(next)
        })
    }
}

/// No frame or no class label: keys apart from every string.
const NONE: u32 = u32::MAX;

pub fn diff(profiles: &[&DecodedProfile], options: &DiffOptions) -> Result<Diff, String> {
    if profiles.len() < 2 {
        return Err("diff needs at least two profiles (the oldest first)".to_string());
    }
    let sample_type = pick_sample_type(profiles, options.sample_type.as_deref(), &options.titles)?;
    let unit = {
        let first = profiles[0];
        first
            .sample_types()
            .swap_remove(first.sample_index(Some(&sample_type))?)
            .1
    };
    let paths = PathShortener::new(&options.base_dir);
    let n = profiles.len();

    let mut strings = SharedStrings {
        ids: InputMap::default(),
    };
    let mut frame_ids: InputMap<(u32, u32, i64), u32> = InputMap::default();
    let mut location_ids: FastHashMap<Vec<u32>, u32> = FastHashMap::default();
    let mut stacks: Accumulator<Vec<u32>> = Accumulator::new(n);
    let mut methods: Accumulator<u32> = Accumulator::new(n);
    let mut classes: Accumulator<u32> = Accumulator::new(n);
    let mut labels: Accumulator<u32> = Accumulator::new(n);
    let mut label_values: Vec<Vec<Option<u32>>> = Vec::new();
    if let Some(key) = &options.by_label {
        label_values = profiles
            .iter()
            .map(|p| p.sample_label_values(key))
            .collect();
        if label_values.iter().flatten().all(Option::is_none) {
            return Err(format!(
                "the first profile: {}",
                profiles[0].missing_label(key)
            ));
        }
    }
    let mut totals = vec![0i64; n];

    for (position, profile) in profiles.iter().enumerate() {
        let index = profile.sample_index(Some(&sample_type))?;
        let mut memo: InputMap<u32, u32> = InputMap::default();
        let global: Vec<u32> = profile
            .frames
            .iter()
            .map(|frame| {
                let key = (
                    strings.id(profile, &mut memo, frame.name),
                    strings.id(profile, &mut memo, frame.file),
                    frame.line,
                );
                let next = frame_ids.len() as u32;
                *frame_ids.entry(key).or_insert(next)
            })
            .collect();
        // A stack is keyed by its locations, each by its frames: one id per
        // distinct frame sequence across the profiles. So a key is as long
        // as the sample's location list, not as its stack with every
        // location's inlined frames repeated.
        let location_keys: Vec<u32> = profile
            .location_frames
            .iter()
            .map(|frames| {
                let frames: Vec<u32> = frames.iter().map(|f| global[*f as usize]).collect();
                let next = location_ids.len() as u32;
                *location_ids.entry(frames).or_insert(next)
            })
            .collect();
        let mut key: Vec<u32> = Vec::new();
        for (sample, value) in profile.values(index).enumerate() {
            if value == 0 {
                continue;
            }
            totals[position] = totals[position].saturating_add(value);
            key.clear();
            key.extend(
                profile.sample_locations[sample]
                    .iter()
                    .map(|location| location_keys[*location as usize]),
            );
            stacks.add(key.clone(), position, sample, value);
            let method = match allocating_frame(profile, sample) {
                Some(frame) => strings.id(profile, &mut memo, frame.name),
                None => NONE,
            };
            methods.add(method, position, sample, value);
            let class = match profile.sample_class[sample] {
                Some(class) => strings.id(profile, &mut memo, class),
                None => NONE,
            };
            classes.add(class, position, sample, value);
            if let Some(values) = label_values.get(position) {
                let label = match values[sample] {
                    Some(label) => strings.id(profile, &mut memo, label),
                    None => NONE,
                };
                labels.add(label, position, sample, value);
            }
        }
    }

    let limit = options.limit;
    let mut describe_stack = |(p, s): (usize, usize)| {
        let profile = profiles[p];
        (describe_site(profile, s, &paths), callers(profile, s))
    };
    let mut describe_method = |(p, s): (usize, usize)| {
        let profile = profiles[p];
        let name = allocating_frame(profile, s)
            .map(|frame| shown(profile.string(frame.name)).into_owned())
            .unwrap_or_else(|| "(no frames)".to_string());
        (name, Vec::new())
    };
    let mut describe_class = |(p, s): (usize, usize)| (class_label(profiles[p], s), Vec::new());
    let mut describe_label = |(p, s): (usize, usize)| {
        let label = label_values
            .get(p)
            .and_then(|values| values[s])
            .map(|value| shown(profiles[p].string(value)).into_owned())
            .unwrap_or_else(|| format!("(no {} label)", options.by_label.as_deref().unwrap_or("")));
        (label, Vec::new())
    };

    // The verdict looks for a steady grower among every stack that grew,
    // not only those shown: it needs them before `section` ranks them. A
    // sampled profile's values are estimates: a row's growth must be a
    // steady rise (in every interval, never down and up in most, or a
    // trend through the noise) and
    // larger than its first and last values' error bars (growth_test.rs).
    let total_growth = totals[n - 1].saturating_sub(totals[0]);
    let errors = total_errors(profiles, &sample_type);
    let errors_of = |values: &[i64]| -> Vec<f64> {
        (0..n)
            .map(|at| standard_error(values[at], totals[at], errors[at]))
            .collect()
    };
    // Where the profiles give their leading functions' errors, a stack's
    // is at least that of the most uncertain function on it (the least
    // sampled part it belongs to): windows that met a function's runs
    // rarely make every stack through it uncertain, which the total's
    // error over the row's share does not tell.
    let function_errors: Vec<_> = profiles
        .iter()
        .map(|profile| parse_function_errors(&profile.comments()))
        .collect();
    let type_index = SAMPLE_TYPES
        .iter()
        .position(|(name, _)| *name == sample_type);
    let stack_errors = |row: &Tally| -> Vec<f64> {
        let mut errors = errors_of(&row.values);
        let Some(type_index) = type_index else {
            return errors;
        };
        if function_errors.iter().all(|errors| errors.is_empty()) {
            return errors;
        }
        let (p, s) = row.seen_at;
        let names: Vec<&str> = profiles[p]
            .stack(s)
            .map(|frame| profiles[p].string(frame.name))
            .collect();
        for (at, error) in errors.iter_mut().enumerate() {
            let mut relative = 0.0f64;
            for (depth, name) in names.iter().enumerate() {
                let Some(function) = function_errors[at].get(*name) else {
                    continue;
                };
                let [flat, cum] = function[type_index];
                relative = relative.max(cum.unwrap_or(0.0));
                if depth == 0 {
                    relative = relative.max(flat.unwrap_or(0.0));
                }
            }
            *error = error.max(relative * row.values[at] as f64);
        }
        errors
    };
    let steady: Vec<Tally> = stacks
        .rows
        .values()
        .filter(|row| {
            row.growth() > 0
                && row.growth() as f64 >= MIN_LEAK_SHARE * total_growth as f64
                && ends_apart(&row.values, &stack_errors(row))
                && rises_steadily(&row.values)
        })
        .map(|row| Tally {
            values: row.values.clone(),
            seen_at: row.seen_at,
        })
        .collect();
    let steady = ranked(steady, 1, &mut describe_stack).pop();
    let by_stack = stacks.section(limit, &mut describe_stack);
    // (Exact profiles: whatever they say is so.)
    let totals_differ = (errors[0] == 0.0 && errors[n - 1] == 0.0)
        || beyond_error(
            totals[0],
            totals[n - 1],
            errors[0] * totals[0] as f64,
            errors[n - 1] * totals[n - 1] as f64,
        );
    let verdict = verdict(
        &sample_type,
        &unit,
        &totals,
        totals_differ,
        by_stack.rows.first(),
        steady.as_ref(),
    );
    let by_label = options.by_label.as_ref().map(|key| {
        let section = labels.section(limit, &mut describe_label);
        let said = label_verdict(key, &section, &unit, total_growth, &errors_of);
        (key.clone(), section, said)
    });
    Ok(Diff {
        sample_type,
        unit,
        totals,
        by_stack,
        by_method: methods.section(limit, &mut describe_method),
        by_class: classes.section(limit, &mut describe_class),
        by_label,
        verdict,
    })
}

/// The callers to show under a site: those not already named in it (a C
/// leaf's site names the Ruby method that called it).
fn callers(profile: &DecodedProfile, sample: usize) -> Vec<String> {
    let mut frames = profile.stack(sample).peekable();
    let leaf_is_c = frames.next().is_some_and(|leaf| leaf.start_line == 0);
    if leaf_is_c && profile.stack(sample).skip(1).any(|f| f.start_line != 0) {
        for frame in frames.by_ref() {
            if frame.start_line != 0 {
                break;
            }
        }
    }
    // The report shows 4 and an ellipsis: stacks can be millions deep.
    frames
        .take(5)
        .map(|f| shown(profile.string(f.name)).into_owned())
        .collect()
}

/// The frame of the method that allocated: the leaf, or for a C method (no
/// start line) the Ruby method that called it.
fn allocating_frame(profile: &DecodedProfile, sample: usize) -> Option<&FrameInfo> {
    let mut frames = profile.stack(sample);
    let leaf = frames.next()?;
    if leaf.start_line == 0 {
        if let Some(caller) = frames.find(|f| f.start_line != 0) {
            return Some(caller);
        }
    }
    Some(leaf)
}

fn growth_percent(row_first: i64, growth: i64) -> String {
    if row_first == 0 {
        if growth > 0 {
            "new".to_string()
        } else {
            "-".to_string()
        }
    } else {
        format!("{:+.0}%", growth as f64 * 100.0 / row_first as f64)
    }
}

/// The share of the total growth a row needs to be called a likely leak.
const MIN_LEAK_SHARE: f64 = 0.1;

/// The one-line answer: which allocation site grew, and how convincingly.
/// `largest`: the stack that grew most; `steady`: the one that grew most
/// of those that rose steadily by a real share of the total, beyond the
/// error bars; `totals_differ`: the first and last totals are further
/// apart than their error bars.
fn verdict(
    sample_type: &str,
    unit: &str,
    totals: &[i64],
    totals_differ: bool,
    largest: Option<&GrowthRow>,
    steady: Option<&GrowthRow>,
) -> String {
    let n = totals.len();
    let first = totals[0];
    let last = totals[n - 1];
    let total_growth = last.saturating_sub(first);
    if !totals_differ && steady.is_none() {
        return format!(
            "Verdict: no clear change: {} went from {} to {} ({}), within the profiles' sampling error.",
            shown(sample_type),
            format_value(first, unit),
            format_value(last, unit),
            format_signed(total_growth, unit)
        );
    }
    if total_growth <= 0 {
        return format!(
            "Verdict: no growth: {} went from {} to {} ({}).",
            shown(sample_type),
            format_value(first, unit),
            format_value(last, unit),
            format_signed(total_growth, unit)
        );
    }
    let share = |row: &GrowthRow| format_percent(row.growth(), total_growth);
    if n == 2 {
        return match largest {
            Some(row) => format!(
                "Verdict: top growing allocation site: {}, {} ({} of the growth).",
                row.label,
                format_signed(row.growth(), unit),
                share(row)
            ),
            None => "Verdict: the total grew, but no single allocation site did.".to_string(),
        };
    }
    let steps = n - 1;
    match (steady, largest) {
        (Some(row), _) => format!(
            "Verdict: likely leak: {} grew in {}, {} → {} ({}, {} of the growth).",
            row.label,
            if row.intervals_up() == steps {
                format!("all {steps} intervals")
            } else if never_falls(&row.values) {
                format!("{} of {steps} intervals and fell in none", row.intervals_up())
            } else {
                format!("{} of {steps} intervals, a steady trend", row.intervals_up())
            },
            format_value(row.values[0], unit),
            format_value(row.values[n - 1], unit),
            format_signed(row.growth(), unit),
            share(row)
        ),
        (None, Some(row)) => format!(
            "Verdict: no big allocation site grew steadily; the largest growth is {}, {} (up in {} of {steps} intervals).",
            row.label,
            format_signed(row.growth(), unit),
            row.intervals_up()
        ),
        (None, None) => "Verdict: the total grew, but no single allocation site did.".to_string(),
    }
}

/// The line naming the value of label `key` that grew most, and whether
/// it rose steadily beyond its error bars (as the verdict asks of a site).
fn label_verdict(
    key: &str,
    section: &Section,
    unit: &str,
    total_growth: i64,
    errors_of: &dyn Fn(&[i64]) -> Vec<f64>,
) -> String {
    // Named among the labelled rows: growth outside any request or job
    // is no answer to "which one grew", and its row is in the section.
    let unlabelled = format!("(no {key} label)");
    let Some(row) = section.rows.iter().find(|row| row.label != unlabelled) else {
        return format!("By {key}: no labelled row grew.");
    };
    let share = if total_growth > 0 {
        format!(
            ", {} of the growth",
            format_percent(row.growth(), total_growth)
        )
    } else {
        String::new()
    };
    let steps = row.values.len() - 1;
    let steady = ends_apart(&row.values, &errors_of(&row.values))
        && (steps == 1 || rises_steadily(&row.values));
    let how = if steps == 1 {
        String::new()
    } else {
        format!(", up in {} of {steps} intervals", row.intervals_up())
    };
    let caveat = if steady {
        ""
    } else {
        " (within sampling error)"
    };
    format!(
        "By {key}: {} grew most, {}{caveat}{share}{how}.",
        row.label,
        format_signed(row.growth(), unit),
    )
}

fn render_section(out: &mut String, title: &str, section: &Section, unit: &str, profiles: usize) {
    let rows = &section.rows;
    let _ = writeln!(
        out,
        "\n{title} (showing {} of {} that grew):",
        rows.len(),
        section.growing
    );
    if rows.is_empty() {
        let _ = writeln!(out, "  nothing grew");
        return;
    }
    let cells: Vec<[String; 3]> = rows
        .iter()
        .map(|r| {
            [
                format_value(r.values[0], unit),
                format_value(r.values[profiles - 1], unit),
                format_signed(r.growth(), unit),
            ]
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let (first_name, last_name) = if profiles == 2 {
        ("base", "new")
    } else {
        ("first", "last")
    };
    let _ = write!(
        out,
        "{first_name:>width$} {last_name:>width$} {:>width$} {:>6}",
        "growth", "%"
    );
    if profiles > 2 {
        let _ = write!(out, " {:>5}", "up");
    }
    out.push('\n');
    for (row, [first, last, growth]) in rows.iter().zip(&cells) {
        let _ = write!(
            out,
            "{first:>width$} {last:>width$} {growth:>width$} {:>6}",
            growth_percent(row.values[0], row.growth())
        );
        if profiles > 2 {
            let _ = write!(
                out,
                " {:>5}",
                format!("{}/{}", row.intervals_up(), profiles - 1)
            );
        }
        let _ = writeln!(out, "  {}", row.label);
        if !row.context.is_empty() {
            let mut callers: Vec<&str> = row.context.iter().take(4).map(String::as_str).collect();
            if row.context.len() > 4 {
                callers.push("…");
            }
            let _ = writeln!(
                out,
                "{:indent$}  via {}",
                "",
                callers.join(" ← "),
                indent = 3 * width + 9 + if profiles > 2 { 6 } else { 0 }
            );
        }
    }
}

/// The positions of the profiles worth comparing by `sample_type`: for
/// in-use, a profile whose in-use is as of the same GC as the one before it
/// repeats it (pprof/inuse_comment.rs), and would read as an interval
/// without growth; it is left out. All of them otherwise, or if fewer than
/// two would be left.
fn informative(profiles: &[&DecodedProfile], sample_type: &str) -> Vec<usize> {
    let all: Vec<usize> = (0..profiles.len()).collect();
    if !sample_type.starts_with("inuse_") {
        return all;
    }
    // (GC, process): the same GC number in two processes (forked workers
    // count on from their master's) says nothing.
    let key = |p: &DecodedProfile| {
        let processes = processes_named(p.comments());
        settled_gc(p.comments()).map(|gc| (gc, processes))
    };
    let keys: Vec<_> = profiles.iter().map(|p| key(p)).collect();
    let kept: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| i == 0 || keys[i].is_none() || keys[i] != keys[i - 1])
        .collect();
    if kept.len() < 2 {
        all
    } else {
        kept
    }
}

pub fn render_diff(profiles: &[&DecodedProfile], options: &DiffOptions) -> Result<String, String> {
    let sample_type = pick_sample_type(profiles, options.sample_type.as_deref(), &options.titles)?;
    let kept = informative(profiles, &sample_type);
    if kept.len() == profiles.len() {
        return render_all(profiles, options);
    }
    let title = |i: usize| {
        options
            .titles
            .get(i)
            .map(|t| shown(t).into_owned())
            .unwrap_or_else(|| format!("profile {}", i + 1))
    };
    let left_out: Vec<String> = (0..profiles.len())
        .filter(|i| !kept.contains(i))
        .map(title)
        .collect();
    let kept_profiles: Vec<&DecodedProfile> = kept.iter().map(|&i| profiles[i]).collect();
    let options = DiffOptions {
        sample_type: Some(sample_type.clone()),
        titles: kept
            .iter()
            .filter_map(|&i| options.titles.get(i).cloned())
            .collect(),
        ..options.clone()
    };
    let mut out = format!(
        "Left out: {} profile{} taken with no GC since the one before (their {}, as of the last \
         completed GC, repeats it): {}.\n",
        left_out.len(),
        if left_out.len() == 1 { "" } else { "s" },
        shown(&sample_type),
        left_out.join(", ")
    );
    out.push_str(&render_all(&kept_profiles, &options)?);
    Ok(out)
}

fn render_all(profiles: &[&DecodedProfile], options: &DiffOptions) -> Result<String, String> {
    let diff = diff(profiles, options)?;
    let n = profiles.len();
    let unit = &diff.unit;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Comparing {} ({}) across {n} profiles, oldest first:",
        shown(&diff.sample_type),
        shown(unit)
    );
    for (position, total) in diff.totals.iter().enumerate() {
        let title = options
            .titles
            .get(position)
            .map(|t| shown(t).into_owned())
            .unwrap_or_else(|| format!("profile {}", position + 1));
        let _ = writeln!(
            out,
            "  {}. {title}: {}",
            position + 1,
            format_value(*total, unit)
        );
    }
    let growth = diff.totals[n - 1].saturating_sub(diff.totals[0]);
    let _ = writeln!(
        out,
        "Total: {} → {} ({}, {})",
        format_value(diff.totals[0], unit),
        format_value(diff.totals[n - 1], unit),
        format_signed(growth, unit),
        growth_percent(diff.totals[0], growth)
    );
    let _ = writeln!(out, "{}", diff.verdict);
    if let Some((_, _, said)) = &diff.by_label {
        let _ = writeln!(out, "{said}");
    }
    render_section(
        &mut out,
        "Growth by allocation site (whole stack)",
        &diff.by_stack,
        unit,
        n,
    );
    render_section(
        &mut out,
        "Growth by allocating method",
        &diff.by_method,
        unit,
        n,
    );
    render_section(&mut out, "Growth by class", &diff.by_class, unit, n);
    if let Some((key, section, _)) = &diff.by_label {
        let title = format!("Growth by label {}", shown(key));
        render_section(&mut out, &title, section, unit, n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoded_profile::tests::profile_from;

    const TYPES: &[(&str, &str)] = &[("alloc_space", "bytes"), ("inuse_space", "bytes")];

    /// A process's heap at one time: the cache holds `cached` bytes, the
    /// renderer's temporaries `noise`.
    fn snapshot(cached: i64, noise: i64) -> DecodedProfile {
        let raw = profile_from(
            TYPES,
            &[
                (
                    &[
                        ("String#*", "/app/cache.rb", 12),
                        ("Cache#fetch", "/app/cache.rb", 12),
                        ("App#call", "/app/app.rb", 5),
                    ],
                    &[cached, cached],
                    Some("String"),
                ),
                (
                    &[
                        ("Array#map", "/app/render.rb", 3),
                        ("Renderer#render", "/app/render.rb", 3),
                        ("App#call", "/app/app.rb", 6),
                    ],
                    &[noise, noise],
                    Some("Array"),
                ),
            ],
        );
        let mut raw = raw;
        // start lines: Ruby methods have one, C methods do not.
        for function in &mut raw.function {
            let name = &raw.string_table[function.name as usize];
            if name.contains("#") && !name.starts_with("String") && !name.starts_with("Array") {
                function.start_line = 1;
            }
        }
        DecodedProfile::from_raw(raw).unwrap()
    }

    /// `snapshot`, sampled: its comment says the totals are off by `rse`.
    fn sampled(cached: i64, noise: i64, rse: f64) -> DecodedProfile {
        let mut raw = snapshot(cached, noise).raw.clone();
        let comment = format!(
            "relative standard error of each total: alloc_space ±{:.1}% (100 effective samples); inuse_space ±{:.1}% (100 effective samples)",
            rse * 100.0,
            rse * 100.0
        );
        raw.string_table.push(comment);
        raw.comment.push(raw.string_table.len() as i64 - 1);
        DecodedProfile::from_raw(raw).unwrap()
    }

    /// `snapshot`, with its in-use as of GC `gc` (pprof/inuse_comment.rs).
    fn as_of_gc(cached: i64, gc: u32) -> DecodedProfile {
        let mut raw = snapshot(cached, 500).raw.clone();
        let cutoff = sampler::state::InuseCutoff::last_completed_gc(gc, false);
        raw.string_table
            .push(pprof::inuse_comment::format_inuse_comment(cutoff, 0));
        raw.comment.push(raw.string_table.len() as i64 - 1);
        DecodedProfile::from_raw(raw).unwrap()
    }

    /// Forked workers count GCs on from their master's: the same number
    /// in two processes' profiles says nothing, and both are compared.
    #[test]
    fn the_same_gc_in_two_processes_is_not_a_repeat() {
        let of = |pid: u32, cached: i64| {
            let mut raw = as_of_gc(cached, 7).raw.clone();
            let identity = pprof::process_comment::ProcessIdentity {
                pid,
                started_millis: 1,
                forked_from: Some(1),
                program: "worker".into(),
            };
            raw.string_table.push(identity.comment());
            raw.comment.push(raw.string_table.len() as i64 - 1);
            DecodedProfile::from_raw(raw).unwrap()
        };
        let profiles = [of(10, 1_000), of(11, 2_000), of(11, 3_000)];
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        assert_eq!(informative(&refs, "inuse_space"), vec![0, 1]);
    }

    /// In-use is as of the last completed GC: a profile with no GC since
    /// the one before repeats its in-use, and an interval with no growth
    /// must not hide a leak that grows at every GC.
    #[test]
    fn profiles_with_no_gc_between_them_count_as_one() {
        let profiles = [
            as_of_gc(1_000, 5),
            as_of_gc(1_000, 5),
            as_of_gc(2_000, 9),
            as_of_gc(3_000, 12),
            as_of_gc(3_000, 12),
            as_of_gc(4_000, 13),
        ];
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        let titles: Vec<String> = (1..=6).map(|i| format!("heap-{i}.pprof")).collect();
        let text = render_diff(
            &refs,
            &DiffOptions {
                titles,
                ..options()
            },
        )
        .unwrap();
        assert!(
            text.starts_with(
                "Left out: 2 profiles taken with no GC since the one before (their inuse_space, as \
                 of the last completed GC, repeats it): heap-2.pprof, heap-5.pprof.\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("Verdict: likely leak: String#* in Cache#fetch at cache.rb:12 grew in all 3 intervals"),
            "{text}"
        );
        // alloc_* is per interval: every profile counts.
        let alloc = render_diff(
            &refs,
            &DiffOptions {
                sample_type: Some("alloc_space".into()),
                ..options()
            },
        )
        .unwrap();
        assert!(!alloc.contains("Left out"), "{alloc}");
        // Fewer than two left: every profile is compared.
        let same = render_diff(&refs[..2], &options()).unwrap();
        assert!(!same.contains("Left out"), "{same}");
    }

    /// A server's leak between phases of requests: level in an interval
    /// that had a GC but served none of what leaks, never down.
    #[test]
    fn a_leak_level_in_an_idle_interval_is_still_named() {
        let profiles = [
            as_of_gc(1_000, 5),
            as_of_gc(2_000, 9),
            as_of_gc(2_000, 10),
            as_of_gc(3_000, 12),
            as_of_gc(4_000, 15),
        ];
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        let text = render_diff(&refs, &options()).unwrap();
        assert!(
            text.contains(
                "Verdict: likely leak: String#* in Cache#fetch at cache.rb:12 grew in 3 of 4 \
                 intervals and fell in none"
            ),
            "{text}"
        );
        // Level more often than up: a cache that filled, not a leak.
        let filled = [
            as_of_gc(1_000, 5),
            as_of_gc(2_000, 9),
            as_of_gc(3_000, 10),
            as_of_gc(3_000, 12),
            as_of_gc(3_000, 15),
            as_of_gc(3_000, 17),
        ];
        let refs: Vec<&DecodedProfile> = filled.iter().collect();
        let text = render_diff(&refs, &options()).unwrap();
        assert!(!text.contains("likely leak"), "{text}");
    }

    /// Sampled profiles of a leak: noisy, not up in every interval, but a
    /// steady trend beyond the error bars; and of no change.
    #[test]
    fn a_leak_is_named_through_sampling_noise_and_noise_is_not_a_change() {
        let jitter = [
            300, -250, 120, -300, 60, 280, -180, -40, 220, -290, 150, -90, 10, 260, -210,
        ];
        let profiles: Vec<DecodedProfile> = (0..30)
            .map(|i| {
                let j = jitter[i % jitter.len()];
                sampled(1_000 + 100 * i as i64 + j, 5_000 - 2 * j, 0.05)
            })
            .collect();
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        let trend = diff(&refs, &DiffOptions::default()).unwrap();
        assert!(
            trend
                .verdict
                .starts_with("Verdict: likely leak: String#* in Cache#fetch")
                && trend.verdict.contains("a steady trend"),
            "{}",
            trend.verdict
        );
        // Two profiles 5% apart, each off by 10%: nothing to call.
        let (a, b) = (sampled(5_000, 5_000, 0.1), sampled(5_300, 5_200, 0.1));
        let noisy = diff(&[&a, &b], &DiffOptions::default()).unwrap();
        assert!(
            noisy
                .verdict
                .starts_with("Verdict: no clear change: inuse_space went from"),
            "{}",
            noisy.verdict
        );
        // The same numbers, exact: the growth is real.
        let (a, b) = (snapshot(5_000, 5_000), snapshot(5_300, 5_200));
        let exact = diff(&[&a, &b], &DiffOptions::default()).unwrap();
        assert!(
            exact.verdict.starts_with("Verdict: top growing"),
            "{}",
            exact.verdict
        );
    }

    /// A stack through a function the profiles call uncertain (windows
    /// met its runs rarely) does not read as a leak on growth within that
    /// error, however sure the totals are.
    #[test]
    fn a_function_the_profiles_call_uncertain_is_not_named_a_leak() {
        let series = |function_rse: Option<f64>| -> Vec<DecodedProfile> {
            (0..4)
                .map(|i| {
                    let mut raw = sampled(2_000 + 300 * i, 5_000, 0.02).raw.clone();
                    if let Some(rse) = function_rse {
                        raw.string_table.push(format!(
                            "relative standard error of a function, flat and cum (%): alloc_objects - - alloc_space - - inuse_objects - - inuse_space - {:.1} in Cache#fetch",
                            100.0 * rse
                        ));
                        raw.comment.push(raw.string_table.len() as i64 - 1);
                    }
                    DecodedProfile::from_raw(raw).unwrap()
                })
                .collect()
        };
        let verdict = |profiles: &[DecodedProfile]| {
            let refs: Vec<&DecodedProfile> = profiles.iter().collect();
            diff(&refs, &DiffOptions::default()).unwrap().verdict
        };
        let sure = verdict(&series(None));
        assert!(
            sure.starts_with("Verdict: likely leak: String#* in Cache#fetch"),
            "{sure}"
        );
        let also_sure = verdict(&series(Some(0.02)));
        assert!(also_sure.starts_with("Verdict: likely leak"), "{also_sure}");
        let unsure = verdict(&series(Some(0.6)));
        assert!(!unsure.contains("likely leak"), "{unsure}");
    }

    fn options() -> DiffOptions {
        DiffOptions {
            base_dir: "/app".to_string(),
            titles: vec!["a.pprof".into(), "b.pprof".into(), "c.pprof".into()],
            ..DiffOptions::default()
        }
    }

    #[test]
    fn two_profiles_name_the_top_growing_site() {
        let (a, b) = (snapshot(1 << 20, 300_000), snapshot(5 << 20, 200_000));
        let diff = diff(&[&a, &b], &options()).unwrap();
        assert_eq!(diff.sample_type, "inuse_space");
        assert_eq!(
            diff.by_stack.rows[0].label,
            "String#* in Cache#fetch at cache.rb:12"
        );
        assert_eq!(diff.by_stack.rows[0].growth(), 4 << 20);
        assert_eq!(diff.by_method.rows[0].label, "Cache#fetch");
        // Array shrank by 100,000 bytes: not among the classes that grew.
        let classes: Vec<&str> = diff
            .by_class
            .rows
            .iter()
            .map(|r| r.label.as_str())
            .collect();
        assert_eq!(classes, ["String"]);
        assert_eq!(diff.by_class.growing, 1);
        let text = render_diff(&[&a, &b], &options()).unwrap();
        assert!(
            text.contains("Verdict: top growing allocation site: String#* in Cache#fetch at cache.rb:12, +4.00 MB (102.4% of the growth)."),
            "{text}"
        );
    }

    #[test]
    fn several_profiles_separate_steady_growth_from_noise() {
        let profiles = [
            snapshot(1 << 20, 300_000),
            snapshot(2 << 20, 900_000),
            snapshot(3 << 20, 100_000),
        ];
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        let diff = diff(&refs, &options()).unwrap();
        let cache = &diff.by_stack.rows[0];
        assert_eq!(cache.intervals_up(), 2);
        // The renderer's noise went 300 kB, 900 kB, 100 kB: up once, down
        // overall, so not among the sites that grew.
        assert_eq!(diff.by_stack.growing, 1);
        assert!(diff
            .by_stack
            .rows
            .iter()
            .all(|r| !r.label.starts_with("Array#map")));
        let text = render_diff(&refs, &options()).unwrap();
        assert!(
            text.contains("Verdict: likely leak: String#* in Cache#fetch at cache.rb:12 grew in all 2 intervals, 1.00 MB → 3.00 MB (+2.00 MB"),
            "{text}"
        );
        assert!(text.contains("  via App#call\n"), "{text}");
    }

    #[test]
    fn a_sliver_that_grows_steadily_is_not_called_the_leak() {
        let profiles: Vec<DecodedProfile> = [(100, 1 << 20), (200, 1 << 20), (300, 50 << 20)]
            .iter()
            .map(|&(tiny, big): &(i64, i64)| {
                let raw = profile_from(
                    TYPES,
                    &[
                        (&[("Tiny#grow", "/app/t.rb", 1)], &[tiny, tiny], None),
                        (&[("Big#leak", "/app/b.rb", 2)], &[big, big], None),
                    ],
                );
                DecodedProfile::from_raw(raw).unwrap()
            })
            .collect();
        let refs: Vec<&DecodedProfile> = profiles.iter().collect();
        let text = render_diff(&refs, &options()).unwrap();
        assert!(
            text.contains(
                "Verdict: no big allocation site grew steadily; the largest growth is Big#leak"
            ),
            "{text}"
        );
    }

    #[test]
    fn no_growth_is_said_plainly() {
        let (a, b) = (snapshot(5 << 20, 0), snapshot(1 << 20, 0));
        let text = render_diff(&[&a, &b], &options()).unwrap();
        assert!(
            text.contains(
                "Verdict: no growth: inuse_space went from 5.00 MB to 1.00 MB (-4.00 MB)."
            ),
            "{text}"
        );
        assert!(text.contains("nothing grew"), "{text}");
    }

    #[test]
    fn needs_two_profiles_with_the_type() {
        let a = snapshot(1, 1);
        assert!(diff(&[&a], &options()).is_err());
        let cpu = DecodedProfile::from_raw(profile_from(&[("cpu", "nanoseconds")], &[])).unwrap();
        let error = diff(&[&a, &cpu], &options()).unwrap_err();
        assert!(
            error.starts_with("b.pprof: this profile has no sample type \"inuse_space\""),
            "{error}"
        );
    }

    #[test]
    fn golden_two_profile_report() {
        let (a, b) = (snapshot(1 << 20, 300_000), snapshot(5 << 20, 200_000));
        let text = render_diff(&[&a, &b], &options()).unwrap();
        let expected = "\
Comparing inuse_space (bytes) across 2 profiles, oldest first:
  1. a.pprof: 1.29 MB
  2. b.pprof: 5.19 MB
Total: 1.29 MB → 5.19 MB (+3.90 MB, +304%)
Verdict: top growing allocation site: String#* in Cache#fetch at cache.rb:12, +4.00 MB (102.4% of the growth).

Growth by allocation site (whole stack) (showing 1 of 1 that grew):
    base      new   growth      %
 1.00 MB  5.00 MB +4.00 MB  +400%  String#* in Cache#fetch at cache.rb:12
                                   via App#call

Growth by allocating method (showing 1 of 1 that grew):
    base      new   growth      %
 1.00 MB  5.00 MB +4.00 MB  +400%  Cache#fetch

Growth by class (showing 1 of 1 that grew):
    base      new   growth      %
 1.00 MB  5.00 MB +4.00 MB  +400%  String
";
        assert_eq!(text, expected);
    }
}
