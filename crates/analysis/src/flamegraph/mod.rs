//! Flame graphs: the stacks of one sample type merged into a call tree, drawn
//! as a self-contained interactive HTML page (`render_html`) or a static SVG
//! (`render_svg`).
//!
//! The tree: the root, "all", holds every stack. A node's children are keyed
//! by (name, file), so the lines of one function merge into one frame, and
//! are sorted by name, then file, as in classic flame graphs: the layout does
//! not depend on the order of the samples. A node's value is the sum of the
//! stacks through it; its self value is the part of that which ends there.
//! Both pictures put the root at the top and callees below their callers
//! (an "icicle"), so the root stays in sight however deep the stacks go.
//!
//! Only stacks with a positive value are drawn. A width cannot show a
//! negative amount, so in a diff profile (new minus base) the stacks that
//! shrank are left out: the graph shows growth only, and both formats say
//! how many stacks were left out and how much they add up to.
//!
//! A retention report beside the profile (`FlameGraphInput::retainers`)
//! becomes the page's "What holds it": the paths of the sites in the
//! clicked frame's function.
//!
//! The HTML page carries no reference to anything outside itself (its
//! Content-Security-Policy forbids loading anything): the header and the
//! table's head are written by html.rs, the tree goes in as JSON in a
//! `<script type="application/json">` (see `write_json`), and
//! `page.js` draws it on a `<canvas>`, with `page.css`.

mod html;
mod svg;
#[cfg(test)]
mod tests;
mod tree;

use super::decoded_profile::DecodedProfile;
use super::display::shown;
use super::units::{format_percent, format_time_utc, format_value};

pub use html::render_html;
pub use svg::render_svg;
use tree::{Tree, MAX_TREE_NODES};

/// One frame of a stack. Borrowed from the profile: a big profile has
/// millions of frames, and copying each name would cost gigabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlameFrame<'a> {
    pub name: &'a str,
    pub file: &'a str,
    pub line: i64,
}

/// One sample's stack, root first and leaf last, with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlameStack<'a> {
    pub frames: Vec<FlameFrame<'a>>,
    pub value: i64,
}

/// A site of a retention report shown beside the graph: its name (the
/// allocating function and where, "Foo#bar (app.rb:12)") and the text of
/// each path that holds one of its objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSite {
    pub site: String,
    pub paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlameGraphInput<'a> {
    /// The page's heading, e.g. the profile's file name.
    pub title: String,
    /// The line under it, e.g. "inuse_space · 12.4 MB total · taken ...".
    pub subtitle: String,
    /// The sample type the values are of, e.g. "inuse_space".
    pub sample_type: String,
    /// The values' unit: "bytes", "count", ... (see `units::format_value`).
    pub unit: String,
    /// A retention report's sites, for the HTML page's "What holds it"
    /// (the paths of the sites in the clicked frame's function).
    pub retainers: Vec<RetentionSite>,
    /// The stacks merged as they came: never all held at once.
    tree: Tree<'a>,
}

impl<'a> FlameGraphInput<'a> {
    /// Merges `stacks` into the call tree as they come, so a caller can
    /// make each stack only when it is asked for.
    pub fn new<S: std::borrow::Borrow<FlameStack<'a>>>(
        title: String,
        subtitle: String,
        sample_type: String,
        unit: String,
        stacks: impl IntoIterator<Item = S>,
    ) -> Self {
        FlameGraphInput {
            title,
            subtitle,
            sample_type,
            unit,
            retainers: Vec::new(),
            tree: Tree::build(stacks),
        }
    }
}

/// Frames per stack in a flame graph at most: deeper stacks keep their
/// root side and end in a "(deeper frames not shown)" frame.
const MAX_FLAME_DEPTH: usize = 1024;

/// A profile's flame graph input for sample type `sample_type` (the
/// default if None): each sample's stack, root first, made as the tree
/// asks for it, names borrowed from the profile.
pub fn flame_graph_of<'a>(
    profile: &'a DecodedProfile,
    sample_type: Option<&str>,
    title: String,
) -> Result<FlameGraphInput<'a>, String> {
    let index = profile.sample_index(sample_type)?;
    let (sample_type, unit) = profile.sample_types().swap_remove(index);
    // Shown in every frame's tooltip: as any other text of the profile.
    let (sample_type, unit) = (shown(&sample_type).into_owned(), shown(&unit).into_owned());
    let total = profile.total(index).max(0);
    let mut subtitle = format!("{sample_type} · {} total", format_value(total, &unit));
    if profile.raw.time_nanos > 0 {
        subtitle.push_str(&format!(
            " · taken {}",
            format_time_utc(profile.raw.time_nanos)
        ));
    }
    // Negative values (a diff written as a profile) go through: the tree
    // leaves them out and says how much it left out.
    let stacks = profile
        .values(index)
        .enumerate()
        .filter(|(_, value)| *value != 0)
        .map(|(sample, value)| {
            let depth = profile.sample_depth[sample] as usize;
            let deeper = depth.saturating_sub(MAX_FLAME_DEPTH - 1);
            let mut frames: Vec<FlameFrame<'a>> = Vec::with_capacity(depth.min(MAX_FLAME_DEPTH));
            if depth > MAX_FLAME_DEPTH {
                frames.push(FlameFrame {
                    name: "(deeper frames not shown)",
                    file: "",
                    line: 0,
                });
            }
            frames.extend(
                profile
                    .stack(sample)
                    .skip(if depth > MAX_FLAME_DEPTH { deeper } else { 0 })
                    .map(|f| FlameFrame {
                        name: profile.string(f.name),
                        file: profile.string(f.file),
                        line: f.line,
                    }),
            );
            frames.reverse();
            FlameStack { frames, value }
        });
    Ok(FlameGraphInput::new(
        title,
        subtitle,
        sample_type,
        unit,
        stacks,
    ))
}

fn no_samples_message(input: &FlameGraphInput<'_>) -> String {
    format!("No samples with {} in this profile", input.sample_type)
}

/// What a diff's shrinking stacks add up to, when there are some.
fn negative_note(input: &FlameGraphInput<'_>, tree: &Tree) -> Option<String> {
    (tree.negative_stacks > 0).then(|| {
        format!(
            "{} {} with a negative value ({} in all) not shown: a flame graph shows growth only",
            tree.negative_stacks,
            if tree.negative_stacks == 1 {
                "stack"
            } else {
                "stacks"
            },
            format_value(tree.negative_value, &input.unit)
        )
    })
}

/// Stacks that met the tree's node limit, when there are some.
fn cut_note(tree: &Tree) -> Option<String> {
    (tree.cut_stacks > 0).then(|| {
        format!(
            "the graph holds at most {MAX_TREE_NODES} frames: {} {} end early, their deeper \
             frames counted in the last frame shown",
            tree.cut_stacks,
            if tree.cut_stacks == 1 {
                "stack"
            } else {
                "stacks"
            },
        )
    })
}

/// What `Tree::prune` left out, when it did.
fn pruned_note(input: &FlameGraphInput<'_>, tree: &Tree) -> Option<String> {
    (tree.pruned_nodes > 0).then(|| {
        format!(
            "{} frames smaller than {} ({} of the total) are not drawn, to keep the page light; \
             their values count in their callers",
            tree.pruned_nodes,
            format_value(tree.pruned_below, &input.unit),
            format_percent(tree.pruned_below, tree.total())
        )
    })
}

/// Writes `text` escaped for HTML or XML text and attribute values. Control
/// characters (but tab, CR, LF) and U+FFFE/U+FFFF, which XML forbids, become
/// U+FFFD.
fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c.is_control() || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
}
