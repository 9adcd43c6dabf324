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
//! The HTML page carries no reference to anything outside itself (its
//! Content-Security-Policy forbids loading anything): the header and the
//! table's head are written here, the tree goes in as JSON in a
//! `<script type="application/json">` (see `write_json`), and
//! `flamegraph/page.js` draws it on a `<canvas>`, with `flamegraph/page.css`.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;

use super::decoded_profile::DecodedProfile;
use super::display::shown;
use super::units::{format_percent, format_time_utc, format_value};
use crate::analysis::InputMap;
use crate::fast_hash::FastHashMap;

const PAGE_CSS: &str = include_str!("flamegraph/page.css");
const PAGE_JS: &str = include_str!("flamegraph/page.js");

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

/// The interactive page: header, flame graph, table of functions.
pub fn render_html(input: &FlameGraphInput<'_>) -> String {
    let mut tree = input.tree.clone();
    // The table covers every frame; the graph only the biggest, so a huge
    // profile's page stays small enough for a browser.
    let functions = tree.functions();
    tree.prune(MAX_PAGE_NODES);
    let mut out = String::with_capacity(PAGE_CSS.len() + PAGE_JS.len() + 64 * tree.nodes.len());
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    // Nothing may be fetched: no scripts, styles, fonts or images but the inline ones.
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; base-uri 'none'; \
         form-action 'none'\">\n",
    );
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    // An empty icon, or the browser would ask the server for /favicon.ico.
    out.push_str("<link rel=\"icon\" href=\"data:,\">\n<title>");
    push_escaped(&mut out, &input.title);
    out.push_str(" · flame graph</title>\n<style>\n");
    out.push_str(PAGE_CSS);
    out.push_str("</style>\n</head>\n<body>\n<header>\n<div class=\"titles\">\n<h1>");
    push_escaped(&mut out, &input.title);
    out.push_str("</h1>\n<p class=\"subtitle\">");
    push_escaped(&mut out, &input.subtitle);
    out.push_str("</p>\n</div>\n");
    if tree.is_empty() {
        out.push_str("</header>\n<main>\n<p class=\"empty\">");
        push_escaped(&mut out, &no_samples_message(input));
        out.push_str("</p>\n");
        push_html_note(&mut out, input, &tree);
        out.push_str("</main>\n</body>\n</html>\n");
        return out;
    }
    out.push_str(
        "<div class=\"controls\">\n\
         <input id=\"search\" type=\"search\" placeholder=\"Search functions\" \
         aria-label=\"Search functions\" autocomplete=\"off\" spellcheck=\"false\">\n\
         <span id=\"matches\" aria-live=\"polite\"></span>\n\
         <button id=\"reset\" type=\"button\">Reset zoom</button>\n\
         </div>\n</header>\n<main>\n",
    );
    push_html_note(&mut out, input, &tree);
    out.push_str(
        "<div id=\"chart\"><canvas id=\"flame\" role=\"img\" aria-label=\"Flame graph of ",
    );
    push_escaped(&mut out, &input.sample_type);
    out.push_str(
        "\"></canvas></div>\n\
         <p class=\"hint\">Click a frame to zoom into it; click the root (\u{201c}all\u{201d}) \
         or Reset zoom to zoom out. Esc resets zoom and search.</p>\n\
         <h2>Functions</h2>\n\
         <table id=\"functions\">\n<thead><tr>\
         <th data-sort=\"flat\">Flat</th><th data-sort=\"flat\">Flat%</th>\
         <th data-sort=\"cum\">Cum</th><th data-sort=\"cum\">Cum%</th>\
         <th data-sort=\"name\" class=\"text\">Function</th>\
         <th data-sort=\"file\" class=\"text\">File</th></tr></thead>\n<tbody></tbody>\n</table>\n\
         <p id=\"functions-note\" class=\"hint\"></p>\n\
         <div id=\"tooltip\" hidden></div>\n</main>\n\
         <script type=\"application/json\" id=\"flamegraph-data\">",
    );
    write_json(&mut out, input, &tree, &functions);
    out.push_str("</script>\n<script>\n");
    out.push_str(PAGE_JS);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

const SVG_WIDTH: f64 = 1200.0;
const SVG_PAD: f64 = 10.0;
const SVG_ROW: f64 = 17.0;
const SVG_FONT: f64 = 12.0;
/// Frames narrower than this many pixels are not drawn (nor their callees).
const MIN_WIDTH: f64 = 0.5;
/// Nodes in the page's graph at most (a few MB of page); see `Tree::prune`.
const MAX_PAGE_NODES: usize = 200_000;
/// Nodes in an SVG at most (its frames narrower than half a pixel are left
/// out anyway; a 1200-pixel-wide picture shows far fewer).
const MAX_SVG_NODES: usize = 20_000;

/// A static SVG, 1200 px wide; `<title>`s give each frame's details on hover.
/// Frames narrower than half a pixel are left out, and their parent's
/// `<title>` says how many and how much they hold.
pub fn render_svg(input: &FlameGraphInput<'_>) -> String {
    // Each drawn frame repeats its names in its <title>: the biggest
    // MAX_SVG_NODES at most, so the file stays a few MB.
    let mut pruned = input.tree.clone();
    pruned.prune(MAX_SVG_NODES);
    let tree = &pruned;
    let total = tree.total();
    let mut notes = Vec::new();
    if tree.is_empty() {
        notes.push(no_samples_message(input));
    }
    notes.extend(negative_note(input, tree));
    notes.extend(cut_note(tree));
    notes.extend(pruned_note(input, tree));
    let graph_top = 52.0 + 16.0 * notes.len() as f64;
    let scale = (SVG_WIDTH - 2.0 * SVG_PAD) / total.max(1) as f64;
    let width_of = |node: &Node| node.total as f64 * scale;

    // Which frames are drawn, and what their parents say of the others.
    let nodes = &tree.nodes;
    let mut hidden_count = vec![0usize; nodes.len()];
    let mut hidden_value = vec![0i64; nodes.len()];
    let mut max_depth = 0;
    let mut i = 0;
    while i < nodes.len() && !tree.is_empty() {
        let node = &nodes[i];
        if i > 0 && width_of(node) < MIN_WIDTH {
            hidden_count[node.parent as usize] += 1;
            hidden_value[node.parent as usize] =
                hidden_value[node.parent as usize].saturating_add(node.total);
            i = node.end as usize;
        } else {
            max_depth = max_depth.max(node.depth);
            i += 1;
        }
    }
    let height = if tree.is_empty() {
        graph_top + SVG_PAD
    } else {
        graph_top + f64::from(max_depth + 1) * SVG_ROW + SVG_PAD
    };

    let mut out = String::with_capacity(256 * nodes.len().min(20_000));
    let _ = write!(
        out,
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{SVG_WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {SVG_WIDTH} {height}\" font-family=\"Verdana, 'DejaVu Sans', sans-serif\" \
         font-size=\"{SVG_FONT}\">\n\
         <style>g:hover rect {{ stroke: #333; stroke-width: 0.5; }} text {{ pointer-events: none; }}</style>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fdfaf6\"/>\n"
    );
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">",
        SVG_WIDTH / 2.0
    );
    push_escaped(&mut out, &input.title);
    let _ = write!(
        out,
        "</text>\n<text x=\"{}\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">",
        SVG_WIDTH / 2.0
    );
    push_escaped(&mut out, &input.subtitle);
    out.push_str("</text>\n");
    for (k, note) in notes.iter().enumerate() {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#8a5a00\">",
            SVG_WIDTH / 2.0,
            58.0 + 16.0 * k as f64
        );
        push_escaped(&mut out, note);
        out.push_str("</text>\n");
    }
    if tree.is_empty() {
        out.push_str("</svg>\n");
        return out;
    }

    // Left edges, in value units: a node starts where its previous sibling ends.
    let mut left = vec![0i64; nodes.len()];
    let mut next_child = vec![0i64; nodes.len()];
    for i in 1..nodes.len() {
        let parent = nodes[i].parent as usize;
        left[i] = next_child[parent];
        next_child[parent] = next_child[parent].saturating_add(nodes[i].total);
        next_child[i] = left[i];
    }
    let mut i = 0;
    while i < nodes.len() {
        let node = &nodes[i];
        let width = width_of(node);
        if i > 0 && width < MIN_WIDTH {
            i = node.end as usize;
            continue;
        }
        let x = SVG_PAD + left[i] as f64 * scale;
        let y = graph_top + f64::from(node.depth) * SVG_ROW;
        out.push_str("<g><title>");
        let mut title = tree.describe(i, input);
        if hidden_count[i] > 0 {
            let _ = write!(
                title,
                "\n{} smaller {} not drawn: {} ({})",
                hidden_count[i],
                if hidden_count[i] == 1 {
                    "callee"
                } else {
                    "callees"
                },
                format_value(hidden_value[i], &input.unit),
                format_percent(hidden_value[i], total)
            );
        }
        push_escaped(&mut out, &title);
        let (r, g, b) = if i == 0 {
            ROOT_COLOR
        } else {
            frame_color(&tree.strings[node.name as usize])
        };
        let _ = write!(
            out,
            "</title><rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{:.1}\" rx=\"2\" \
             fill=\"rgb({r},{g},{b})\"/>",
            (width - 0.5).max(0.1),
            SVG_ROW - 1.0
        );
        let label = tree.label(i, input);
        if let Some(text) = fit_label(&label, width) {
            let _ = write!(out, "<text x=\"{:.2}\" y=\"{:.1}\">", x + 3.0, y + 12.0);
            push_escaped(&mut out, &text);
            out.push_str("</text>");
        }
        out.push_str("</g>\n");
        i += 1;
    }
    out.push_str("</svg>\n");
    out
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

fn push_html_note(out: &mut String, input: &FlameGraphInput<'_>, tree: &Tree) {
    let pruned = pruned_note(input, tree).map(|note| format!("{note}, and in the table below"));
    for note in [negative_note(input, tree), cut_note(tree), pruned]
        .into_iter()
        .flatten()
    {
        out.push_str("<p class=\"note\">");
        push_escaped(out, &note);
        out.push_str("</p>\n");
    }
}

/// `label` cut to what fits in `width` pixels (about 0.6 em a character),
/// ending in ".." when cut; None when not even 3 characters fit.
fn fit_label(label: &str, width: f64) -> Option<String> {
    let fits = ((width - 6.0) / (SVG_FONT * 0.6)).floor();
    if fits < 3.0 {
        return None;
    }
    let fits = fits as usize;
    if label.chars().count() <= fits {
        return Some(label.to_string());
    }
    let mut cut: String = label.chars().take(fits - 2).collect();
    cut.push_str("..");
    Some(cut)
}

/// A warm color (red to yellow) picked by a hash of the frame's name, so a
/// function keeps its color across runs and profiles. page.js's `frameColor`
/// computes the same one.
fn frame_color(name: &str) -> (u32, u32, u32) {
    // FNV-1a over UTF-16 code units, as JavaScript sees the string.
    let mut hash: u32 = 0x811c_9dc5;
    for unit in name.encode_utf16() {
        hash ^= u32::from(unit);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let (v1, v2, v3) = (hash & 0xff, (hash >> 8) & 0xff, (hash >> 16) & 0xff);
    (205 + 50 * v1 / 255, 80 + 120 * v2 / 255, 40 + 50 * v3 / 255)
}

const ROOT_COLOR: (u32, u32, u32) = (214, 204, 190);

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

/// Writes `text` as a JSON string that is also safe inside an HTML
/// `<script>` element: `<`, `>` and `&` as \u escapes, so no `</script>` or
/// `<!--` can appear, and U+2028/U+2029 too.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_json_key(out: &mut String, key: &str) {
    push_json_string(out, key);
    out.push(':');
}

fn push_json_numbers(out: &mut String, key: &str, values: impl Iterator<Item = i64>) {
    push_json_key(out, key);
    out.push('[');
    for (k, value) in values.enumerate() {
        if k > 0 {
            out.push(',');
        }
        let _ = write!(out, "{value}");
    }
    out.push(']');
}

/// The page's data, compact for trees of 100k+ nodes:
///
/// ```text
/// { "sampleType": "inuse_space", "unit": "bytes", "total": 123,
///   "rootLabel": "all (123 B)",
///   "strings": ["all", "", "<main>", "app.rb", ...],   names and files, once each
///   "nodes": {              one entry per node, in depth-first order (a node's
///     "name": [0, 2, ...],  subtree follows it), children sorted by name;
///     "file": [1, 3, ...],  node 0 is the root. name, file: indexes in strings;
///     "line": [0, 12, ...], line: 0 when unknown or when the merged frames
///     "depth": [0, 1, ...], have different lines; value: the node's total
///     "value": [123, ...] },  (its self value is that minus its children's)
///   "functions": { "name": [...], "file": [...], "flat": [...], "cum": [...] } }
/// ```
///
/// `functions` merges a function's frames across the tree, sorted by flat
/// value: flat is what ends in it, cum what passes through it (counted once
/// per stack even when it recurses).
fn write_json(out: &mut String, input: &FlameGraphInput<'_>, tree: &Tree, functions: &[Function]) {
    let nodes = &tree.nodes;
    out.push('{');
    push_json_key(out, "sampleType");
    push_json_string(out, &input.sample_type);
    out.push(',');
    push_json_key(out, "unit");
    push_json_string(out, &input.unit);
    let _ = write!(out, ",\"total\":{},", tree.total());
    push_json_key(out, "rootLabel");
    push_json_string(out, &tree.label(0, input));
    out.push(',');
    push_json_key(out, "strings");
    out.push('[');
    for (k, string) in tree.strings.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        push_json_string(out, string);
    }
    out.push_str("],\"nodes\":{");
    push_json_numbers(out, "name", nodes.iter().map(|n| i64::from(n.name)));
    out.push(',');
    push_json_numbers(out, "file", nodes.iter().map(|n| i64::from(n.file)));
    out.push(',');
    push_json_numbers(out, "line", nodes.iter().map(|n| n.line));
    out.push(',');
    push_json_numbers(out, "depth", nodes.iter().map(|n| i64::from(n.depth)));
    out.push(',');
    push_json_numbers(out, "value", nodes.iter().map(|n| n.total));
    out.push_str("},\"functions\":{");
    push_json_numbers(out, "name", functions.iter().map(|f| i64::from(f.name)));
    out.push(',');
    push_json_numbers(out, "file", functions.iter().map(|f| i64::from(f.file)));
    out.push(',');
    push_json_numbers(out, "flat", functions.iter().map(|f| f.flat));
    out.push(',');
    push_json_numbers(out, "cum", functions.iter().map(|f| f.cum));
    out.push_str("}}");
}

/// One node of the merged tree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// Indexes in `Tree::strings`.
    name: u32,
    file: u32,
    /// The frames' line, or 0 when they differ.
    line: i64,
    /// The root is its own parent.
    parent: u32,
    depth: u32,
    /// Sum of the stacks through this node.
    total: i64,
    /// Sum of the stacks that end here.
    self_value: i64,
    /// Index just past this node's subtree: its descendants are `i + 1..end`.
    end: u32,
}

/// A function of the table: its frames merged across the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: u32,
    file: u32,
    flat: i64,
    cum: i64,
}

/// Nodes the call tree holds at most while it is built (about 90 bytes
/// each then): stacks met past it end at the node they reached. A 10 MB
/// profile of this gem makes fewer than a million.
const MAX_TREE_NODES: usize = 2_000_000;

/// The call tree, nodes in depth-first order, children sorted by (name,
/// file); node 0 is the root, "all".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tree<'a> {
    /// Names and files, each once; 0 is "all", 1 is "".
    strings: Vec<Cow<'a, str>>,
    nodes: Vec<Node>,
    /// Stacks left out for their negative value, and their sum.
    negative_stacks: usize,
    negative_value: i64,
    /// Nodes `prune` dropped, all smaller than `pruned_below`.
    pruned_nodes: usize,
    pruned_below: i64,
    /// Stacks whose deeper frames were not added (MAX_TREE_NODES).
    cut_stacks: usize,
}

impl<'a> Tree<'a> {
    fn build<S: std::borrow::Borrow<FlameStack<'a>>>(
        stacks: impl IntoIterator<Item = S>,
    ) -> Tree<'a> {
        struct Building {
            name: u32,
            file: u32,
            line: i64,
            total: i64,
            self_value: i64,
            children: Vec<u32>,
        }
        let mut strings: Vec<&'a str> = Vec::new();
        let mut string_ids: InputMap<&'a str, u32> = InputMap::default();
        // By address first: a profile's frames borrow its string table, so
        // one name is one slice, hashed once however long it is and however
        // many frames use it.
        // (Addresses and our own ids are nobody's choice: FxHash is safe.)
        let mut slice_ids: FastHashMap<(usize, usize), u32> = FastHashMap::default();
        let mut intern = |s: &'a str| -> u32 {
            *slice_ids
                .entry((s.as_ptr() as usize, s.len()))
                .or_insert_with(|| {
                    *string_ids.entry(s).or_insert_with(|| {
                        strings.push(s);
                        (strings.len() - 1) as u32
                    })
                })
        };
        let root_name = intern("all");
        let root_file = intern("");
        let mut nodes = vec![Building {
            name: root_name,
            file: root_file,
            line: 0,
            total: 0,
            self_value: 0,
            children: Vec::new(),
        }];
        let mut child_ids: FastHashMap<(u32, u32, u32), u32> = FastHashMap::default();
        let (mut negative_stacks, mut negative_value) = (0, 0i64);
        let mut cut_stacks = 0;
        for stack in stacks {
            let stack = stack.borrow();
            let value = stack.value;
            if value <= 0 {
                if value < 0 {
                    negative_stacks += 1;
                    negative_value = negative_value.saturating_add(value);
                }
                continue;
            }
            let mut at = 0u32;
            nodes[0].total = nodes[0].total.saturating_add(value);
            for frame in &stack.frames {
                let key = (at, intern(frame.name), intern(frame.file));
                let new_id = nodes.len() as u32;
                if nodes.len() >= MAX_TREE_NODES && !child_ids.contains_key(&key) {
                    cut_stacks += 1;
                    break;
                }
                let child = *child_ids.entry(key).or_insert(new_id);
                if child == new_id {
                    nodes.push(Building {
                        name: key.1,
                        file: key.2,
                        line: frame.line,
                        total: 0,
                        self_value: 0,
                        children: Vec::new(),
                    });
                    nodes[at as usize].children.push(child);
                } else if nodes[child as usize].line != frame.line {
                    nodes[child as usize].line = 0;
                }
                let node = &mut nodes[child as usize];
                node.total = node.total.saturating_add(value);
                at = child;
            }
            let node = &mut nodes[at as usize];
            node.self_value = node.self_value.saturating_add(value);
        }
        drop(child_ids);

        // Depth-first order, children sorted; an explicit stack, as stacks
        // can be thousands of frames deep.
        let ranks = string_ranks(&strings);
        let mut ordered: Vec<Node> = Vec::with_capacity(nodes.len());
        let mut todo: Vec<(u32, u32, u32)> = vec![(0, 0, 0)]; // (building id, parent, depth)
        while let Some((id, parent, depth)) = todo.pop() {
            let new_id = ordered.len() as u32;
            let mut children = std::mem::take(&mut nodes[id as usize].children);
            let building = &nodes[id as usize];
            ordered.push(Node {
                name: building.name,
                file: building.file,
                line: building.line,
                parent,
                depth,
                total: building.total,
                self_value: building.self_value,
                end: new_id + 1,
            });
            children.sort_unstable_by(|&a, &b| {
                let (a, b) = (&nodes[a as usize], &nodes[b as usize]);
                compare_frames(&ranks, (a.name, a.file), (b.name, b.file))
            });
            todo.extend(
                children
                    .iter()
                    .rev()
                    .map(|&child| (child, new_id, depth + 1)),
            );
        }
        for i in (1..ordered.len()).rev() {
            let (parent, end) = (ordered[i].parent as usize, ordered[i].end);
            ordered[parent].end = ordered[parent].end.max(end);
        }
        // Strings renumbered in order of first use, so the output does not
        // depend on the order of the samples either; as reports show them
        // (control characters escaped, cut past MAX_SHOWN_CHARS).
        let mut renumbered = vec![u32::MAX; strings.len()];
        let mut used: Vec<Cow<'a, str>> = Vec::with_capacity(strings.len());
        for node in &mut ordered {
            for id in [&mut node.name, &mut node.file] {
                if renumbered[*id as usize] == u32::MAX {
                    renumbered[*id as usize] = used.len() as u32;
                    used.push(shown(strings[*id as usize]));
                }
                *id = renumbered[*id as usize];
            }
        }
        Tree {
            strings: used,
            nodes: ordered,
            negative_stacks,
            negative_value,
            pruned_nodes: 0,
            pruned_below: 0,
            cut_stacks,
        }
    }

    /// Keeps the `max_nodes` biggest nodes (by total; more on ties) and
    /// drops the rest. A node is never bigger than its parent, so what is
    /// kept is still a tree, in the same order; a parent's dropped children
    /// show as part of its own (self) width.
    fn prune(&mut self, max_nodes: usize) {
        if self.nodes.len() <= max_nodes || max_nodes == 0 {
            return;
        }
        let mut totals: Vec<i64> = self.nodes.iter().map(|n| n.total).collect();
        let (_, threshold, _) = totals.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
        let threshold = (*threshold).max(1);
        let mut new_index = vec![u32::MAX; self.nodes.len()];
        let mut kept: Vec<Node> = Vec::with_capacity(max_nodes);
        for (i, node) in self.nodes.iter().enumerate() {
            if i == 0 || node.total >= threshold {
                new_index[i] = kept.len() as u32;
                let mut node = node.clone();
                node.parent = new_index[node.parent as usize];
                node.end = kept.len() as u32 + 1;
                kept.push(node);
            }
        }
        for i in (1..kept.len()).rev() {
            let (parent, end) = (kept[i].parent as usize, kept[i].end);
            kept[parent].end = kept[parent].end.max(end);
        }
        self.pruned_nodes = self.nodes.len() - kept.len();
        self.pruned_below = threshold;
        self.nodes = kept;
    }

    fn total(&self) -> i64 {
        self.nodes[0].total
    }

    fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// The text drawn on a frame: its name; the root's shows the total.
    fn label(&self, i: usize, input: &FlameGraphInput<'_>) -> String {
        let node = &self.nodes[i];
        if i == 0 {
            format!("all ({})", format_value(node.total, &input.unit))
        } else {
            self.strings[node.name as usize].to_string()
        }
    }

    /// A frame's tooltip: name, file:line, value and self value.
    fn describe(&self, i: usize, input: &FlameGraphInput<'_>) -> String {
        let node = &self.nodes[i];
        let total = self.total();
        let mut text = self.label(i, input);
        let file = &self.strings[node.file as usize];
        if !file.is_empty() {
            text.push('\n');
            text.push_str(file);
            if node.line > 0 {
                let _ = write!(text, ":{}", node.line);
            }
        }
        let _ = write!(
            text,
            "\n{} ({}) {}",
            format_value(node.total, &input.unit),
            format_percent(node.total, total),
            input.sample_type
        );
        if i > 0 {
            let _ = write!(
                text,
                "\nself: {} ({})",
                format_value(node.self_value, &input.unit),
                format_percent(node.self_value, total)
            );
        }
        text
    }

    /// Functions (name, file) with their flat and cum values, largest flat
    /// first. A recursive function's cum counts each stack once: only its
    /// outermost frame on a path adds to it.
    fn functions(&self) -> Vec<Function> {
        let ranks = string_ranks(&self.strings);
        let mut functions: Vec<Function> = Vec::new();
        let mut function_ids: FastHashMap<(u32, u32), u32> = FastHashMap::default();
        let mut on_path: Vec<u32> = Vec::new(); // frames of each function on the path
        let mut path: Vec<(usize, u32)> = Vec::new(); // (node, function), root excluded
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            while let Some(&(top, function)) = path.last() {
                if (self.nodes[top].end as usize) > i {
                    break;
                }
                on_path[function as usize] -= 1;
                path.pop();
            }
            let function = *function_ids
                .entry((node.name, node.file))
                .or_insert_with(|| {
                    functions.push(Function {
                        name: node.name,
                        file: node.file,
                        flat: 0,
                        cum: 0,
                    });
                    on_path.push(0);
                    (functions.len() - 1) as u32
                });
            let entry = &mut functions[function as usize];
            entry.flat = entry.flat.saturating_add(node.self_value);
            if on_path[function as usize] == 0 {
                entry.cum = entry.cum.saturating_add(node.total);
            }
            on_path[function as usize] += 1;
            path.push((i, function));
        }
        functions.sort_by(|a, b| {
            b.flat
                .cmp(&a.flat)
                .then(b.cum.cmp(&a.cum))
                .then_with(|| compare_frames(&ranks, (a.name, a.file), (b.name, b.file)))
        });
        functions
    }
}

/// Frames ordered by name, then file, through `string_ranks`.
fn compare_frames(ranks: &[u32], a: (u32, u32), b: (u32, u32)) -> Ordering {
    let rank = |id: u32| ranks[id as usize];
    rank(a.0)
        .cmp(&rank(b.0))
        .then_with(|| rank(a.1).cmp(&rank(b.1)))
}

/// Each string's place among all of them in text order: strings are
/// compared once each here, then frames by number (names can be long, and
/// share long prefixes, and a tree sorts millions of children).
fn string_ranks<S: AsRef<str>>(strings: &[S]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..strings.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        strings[a as usize]
            .as_ref()
            .cmp(strings[b as usize].as_ref())
    });
    let mut ranks = vec![0u32; strings.len()];
    for (rank, &index) in order.iter().enumerate() {
        ranks[index as usize] = rank as u32;
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaks its strings: tests build frames from format!s, and a
    /// FlameFrame borrows (as it borrows from a profile in the real use).
    fn frame(name: &str, file: &str, line: i64) -> FlameFrame<'static> {
        FlameFrame {
            name: Box::leak(name.to_string().into_boxed_str()),
            file: Box::leak(file.to_string().into_boxed_str()),
            line,
        }
    }

    /// A stack of frames named `names` (root first), all in app.rb.
    fn stack(names: &[&str], value: i64) -> FlameStack<'static> {
        FlameStack {
            frames: names
                .iter()
                .enumerate()
                .map(|(k, name)| frame(name, "app.rb", k as i64 + 1))
                .collect(),
            value,
        }
    }

    fn input(stacks: Vec<FlameStack<'static>>) -> FlameGraphInput<'static> {
        FlameGraphInput::new(
            "heap-1234-5.pprof".to_string(),
            "inuse_space · test".to_string(),
            "inuse_space".to_string(),
            "bytes".to_string(),
            stacks,
        )
    }

    /// The tree as "  name total/self" lines, indented by depth.
    fn outline(tree: &Tree) -> Vec<String> {
        tree.nodes
            .iter()
            .map(|n| {
                format!(
                    "{}{} {}/{}",
                    "  ".repeat(n.depth as usize),
                    tree.strings[n.name as usize],
                    n.total,
                    n.self_value
                )
            })
            .collect()
    }

    #[test]
    fn merges_stacks_into_a_sorted_tree() {
        let stacks = vec![
            stack(&["main", "b", "x"], 5),
            stack(&["main", "a"], 3),
            stack(&["main", "b"], 2),
            stack(&["main", "b", "x"], 1),
            stack(&["other"], 4),
        ];
        let tree = Tree::build(&stacks);
        assert_eq!(
            outline(&tree),
            [
                "all 15/0",
                "  main 11/0",
                "    a 3/3",
                "    b 8/2",
                "      x 6/6",
                "  other 4/4",
            ]
        );
        let ends: Vec<u32> = tree.nodes.iter().map(|n| n.end).collect();
        assert_eq!(ends, [6, 5, 3, 5, 5, 6]);
        let parents: Vec<u32> = tree.nodes.iter().map(|n| n.parent).collect();
        assert_eq!(parents, [0, 0, 1, 1, 3, 0]);
    }

    #[test]
    fn same_name_in_another_file_is_another_frame_and_lines_merge() {
        let stacks = vec![
            FlameStack {
                frames: vec![frame("run", "a.rb", 1), frame("leaf", "a.rb", 10)],
                value: 1,
            },
            FlameStack {
                frames: vec![frame("run", "a.rb", 2), frame("leaf", "a.rb", 10)],
                value: 2,
            },
            FlameStack {
                frames: vec![frame("run", "b.rb", 1)],
                value: 4,
            },
        ];
        let tree = Tree::build(&stacks);
        assert_eq!(
            outline(&tree),
            ["all 7/0", "  run 3/0", "    leaf 3/3", "  run 4/4"]
        );
        let files: Vec<&str> = tree
            .nodes
            .iter()
            .map(|n| tree.strings[n.file as usize].as_ref())
            .collect();
        assert_eq!(files, ["", "a.rb", "a.rb", "b.rb"]);
        let lines: Vec<i64> = tree.nodes.iter().map(|n| n.line).collect();
        assert_eq!(lines, [0, 0, 10, 1], "differing lines merge into 0");
    }

    #[test]
    fn layout_does_not_depend_on_sample_order() {
        let mut stacks = vec![
            stack(&["main", "zeta"], 1),
            stack(&["main", "alpha", "x"], 2),
            stack(&["main", "Beta"], 3),
            stack(&["main", "alpha", "y"], 4),
        ];
        let forward = (
            render_html(&input(stacks.clone())),
            render_svg(&input(stacks.clone())),
        );
        stacks.reverse();
        let backward = (
            render_html(&input(stacks.clone())),
            render_svg(&input(stacks.clone())),
        );
        assert!(
            forward == backward,
            "output depends on the order of the stacks"
        );
        let tree = Tree::build(&stacks);
        let names: Vec<&str> = tree
            .nodes
            .iter()
            .map(|n| tree.strings[n.name as usize].as_ref())
            .collect();
        assert_eq!(names, ["all", "main", "Beta", "alpha", "x", "y", "zeta"]);
    }

    #[test]
    fn zero_and_negative_stacks_are_left_out() {
        let stacks = vec![
            stack(&["main", "grew"], 10),
            stack(&["main", "shrank"], -4),
            stack(&["main", "shrank", "more"], -2),
            stack(&["main", "same"], 0),
        ];
        let tree = Tree::build(&stacks);
        assert_eq!(
            outline(&tree),
            ["all 10/0", "  main 10/0", "    grew 10/10"]
        );
        assert_eq!((tree.negative_stacks, tree.negative_value), (2, -6));
        let html = render_html(&input(stacks.clone()));
        assert!(html.contains("2 stacks with a negative value (-6 B in all) not shown"));
        assert!(!html.contains("shrank"));
        let svg = render_svg(&input(stacks));
        assert!(svg.contains("2 stacks with a negative value (-6 B in all) not shown"));
    }

    #[test]
    fn empty_stacks_count_in_the_root() {
        let stacks = [stack(&[], 7), stack(&["main"], 3)];
        let tree = Tree::build(&stacks);
        assert_eq!(outline(&tree), ["all 10/7", "  main 3/3"]);
    }

    #[test]
    fn pruning_keeps_the_biggest_nodes_as_a_tree() {
        let stacks: Vec<FlameStack> = (0..50)
            .map(|i| stack(&["main", &format!("f{}", i % 5), &format!("g{i}")], 1 + i))
            .collect();
        let mut tree = Tree::build(&stacks);
        let functions_before = tree.functions();
        let before = tree.nodes.len();
        assert_eq!(before, 1 + 1 + 5 + 50);
        tree.prune(10);
        assert_eq!(tree.pruned_nodes, before - tree.nodes.len());
        assert!(
            tree.nodes.len() >= 10 && tree.nodes.len() < before,
            "{}",
            tree.nodes.len()
        );
        // Still a tree in depth-first order: parents come first, and each
        // subtree's `end` covers its kept descendants.
        for (i, node) in tree.nodes.iter().enumerate().skip(1) {
            let parent = &tree.nodes[node.parent as usize];
            assert!((node.parent as usize) < i && parent.end >= node.end);
            assert!(node.total >= tree.pruned_below);
        }
        assert_eq!(
            tree.total(),
            (1..=50).sum::<i64>(),
            "the root keeps the whole total"
        );
        let names: Vec<&str> = tree
            .nodes
            .iter()
            .map(|n| tree.strings[n.name as usize].as_ref())
            .collect();
        assert!(
            names.contains(&"g49") && !names.contains(&"g0"),
            "{names:?}"
        );
        // The table is computed before pruning: all 50 leaves are in it.
        assert_eq!(functions_before.len(), 1 + 5 + 50);
        let html = render_html(&input(stacks));
        assert!(
            !html.contains("frames smaller than"),
            "57 nodes are far under the page's limit"
        );
    }

    #[test]
    fn functions_count_recursion_once() {
        let stacks = vec![
            stack(&["main", "walk", "walk", "walk", "alloc"], 5),
            stack(&["main", "walk"], 2),
            stack(&["main", "alloc"], 1),
        ];
        let tree = Tree::build(&stacks);
        let table: Vec<(String, i64, i64)> = tree
            .functions()
            .iter()
            .map(|f| (tree.strings[f.name as usize].to_string(), f.flat, f.cum))
            .collect();
        assert_eq!(
            table,
            [
                ("alloc".to_string(), 6, 6),
                ("walk".to_string(), 2, 7),
                ("main".to_string(), 0, 8),
            ]
        );
    }

    const HOSTILE: &str = "</script><script>alert(1)</script>";

    #[test]
    fn json_strings_cannot_close_the_script_element() {
        let mut out = String::new();
        push_json_string(&mut out, &format!("{HOSTILE}\"&'\\\n\u{1}\u{2028}é🔥"));
        assert_eq!(
            out,
            "\"\\u003c/script\\u003e\\u003cscript\\u003ealert(1)\\u003c/script\\u003e\
             \\\"\\u0026'\\\\\\n\\u0001\\u2028é🔥\""
        );
    }

    #[test]
    fn markup_is_escaped() {
        let mut out = String::new();
        push_escaped(&mut out, "block in <class:Foo> Hash#[]= \"&' \u{7}é🔥");
        assert_eq!(
            out,
            "block in &lt;class:Foo&gt; Hash#[]= &quot;&amp;&#39; \u{fffd}é🔥"
        );
    }

    fn hostile_input() -> FlameGraphInput<'static> {
        let mut hostile = input(vec![
            FlameStack {
                frames: vec![
                    frame("<main>", "app.rb", 1),
                    frame(HOSTILE, "\"&'.rb", 2),
                    frame("\"&'", "</script>.rb", 3),
                    frame("Hash#[]=", "<internal:hash>", 0),
                ],
                value: 1000,
            },
            stack(&["<main>", "block in <class:Foo>", "String#*"], 500),
            stack(&["<main>", "Émoji 🔥#ü"], 300),
        ]);
        hostile.title = format!("{HOSTILE}\"&'");
        hostile.subtitle = format!("{HOSTILE} · 1.76 kB");
        hostile.sample_type = "<b>".to_string();
        hostile
    }

    #[test]
    fn hostile_names_cannot_break_out_of_the_html() {
        let html = render_html(&hostile_input());
        // The two script elements (data and code) are the only ones.
        assert_eq!(html.matches("<script").count(), 2, "{html}");
        assert_eq!(html.matches("</script>").count(), 2);
        assert!(!html.contains("alert(1)</"));
        assert!(html.contains(
            "<h1>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;&#39;</h1>"
        ));
        assert!(html.contains("\\u003c/script\\u003e\\u003cscript\\u003ealert(1)"));
        assert!(html.contains("\"\\\"\\u0026'\""), "the name \"&' as JSON");
        assert!(html.contains("\"Émoji 🔥#ü\""));
        assert!(html.contains("aria-label=\"Flame graph of &lt;b&gt;\""));
        // The data element holds nothing but JSON: no raw < at all.
        let data_start = html.find("id=\"flamegraph-data\">").unwrap() + 21;
        let data_end = data_start + html[data_start..].find("</script>").unwrap();
        assert!(!html[data_start..data_end].contains('<'));
    }

    #[test]
    fn hostile_names_cannot_break_out_of_the_svg() {
        let svg = render_svg(&hostile_input());
        assert_well_formed(&svg);
        assert!(!svg.contains("<script"));
        assert!(svg.contains("&lt;/script&gt;&lt;script&gt;alert(1)"));
        assert!(svg.contains("&quot;&amp;&#39;"));
        assert!(svg.contains("&lt;main&gt;"));
        assert!(svg.contains("Hash#[]="));
        assert!(svg.contains("Émoji 🔥#ü"));
    }

    #[test]
    fn assets_cannot_close_their_elements() {
        assert!(!PAGE_JS.to_ascii_lowercase().contains("</script"));
        assert!(!PAGE_JS.contains("<!--"));
        assert!(!PAGE_CSS.to_ascii_lowercase().contains("</style"));
    }

    #[test]
    fn empty_input_says_so() {
        for stacks in [vec![], vec![stack(&["main"], 0)]] {
            let mut empty = input(stacks);
            empty.sample_type = "alloc_objects".to_string();
            let html = render_html(&empty);
            assert!(html.contains("No samples with alloc_objects in this profile"));
            assert!(!html.contains("<script"));
            let svg = render_svg(&empty);
            assert_well_formed(&svg);
            assert!(svg.contains("No samples with alloc_objects in this profile"));
        }
    }

    #[test]
    fn svg_draws_frames_with_titles_and_fitted_labels() {
        let long = "VeryLongModuleName::WithANestedClass#and_a_rather_long_method_name";
        let stacks = vec![
            stack(&["<main>", "App#handle", "PageCache#fetch"], 900),
            stack(&["<main>", "App#handle", long], 100),
        ];
        let svg = render_svg(&input(stacks));
        assert_well_formed(&svg);
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("width=\"1200\""));
        assert!(svg.contains(">all (1000 B)</text>"));
        assert!(svg.contains("<title>PageCache#fetch\napp.rb:3\n900 B (90.0%) inuse_space\nself: 900 B (90.0%)</title>"));
        // 100 of 1000 is 118 px: about 15 characters fit.
        assert!(svg.contains(&format!("<title>{long}\n")));
        assert!(svg.contains(">VeryLongModul..</text>"), "{svg}");
        assert_eq!(fit_label("ab", 5.0), None);
        assert_eq!(fit_label("abc", 40.0).as_deref(), Some("abc"));
    }

    #[test]
    fn svg_summarizes_narrow_frames_in_their_parent() {
        let mut stacks = vec![stack(&["main", "big"], 1_000_000)];
        for k in 0..5 {
            stacks.push(stack(&["main", &format!("tiny{k}"), "deeper"], 10));
        }
        let svg = render_svg(&input(stacks));
        assert_well_formed(&svg);
        assert!(!svg.contains("tiny"));
        assert!(!svg.contains("deeper"));
        assert!(
            svg.contains("5 smaller callees not drawn: 50 B (0.0%)"),
            "{svg}"
        );
    }

    #[test]
    fn colors_are_warm_and_stable() {
        assert_eq!(frame_color("String#*"), frame_color("String#*"));
        assert_ne!(frame_color("String#*"), frame_color("Array#map"));
        for name in ["a", "<main>", "🔥", ""] {
            let (r, g, b) = frame_color(name);
            let warm =
                (205..=255).contains(&r) && (80..=200).contains(&g) && (40..=90).contains(&b);
            assert!(warm, "{name}: {r},{g},{b}");
        }
        // Pinned: page.js computes the same (FNV-1a over UTF-16).
        assert_eq!(frame_color("String#*"), frame_color_reference("String#*"));
    }

    /// frame_color spelled out as page.js does it, from the UTF-16 units.
    fn frame_color_reference(name: &str) -> (u32, u32, u32) {
        let units: Vec<u16> = name.encode_utf16().collect();
        let mut h: u64 = 2_166_136_261;
        for u in units {
            h ^= u64::from(u);
            h = (h * 16_777_619) % (1 << 32);
        }
        let h = h as u32;
        (
            205 + 50 * (h & 255) / 255,
            80 + 120 * ((h >> 8) & 255) / 255,
            40 + 50 * ((h >> 16) & 255) / 255,
        )
    }

    #[test]
    fn big_profiles_render_in_linear_time() {
        // 200k stacks, 1M frames, ~200k distinct leaves: a quadratic step
        // here would take minutes.
        let n = crate::test_support::miri_scaled(200_000);
        let big = input(big_stacks(n));
        assert!(big.tree.nodes.len() > n);
        let html = render_html(&big);
        assert!(html.contains("\"leaf199999\"") || cfg!(miri));
        let svg = render_svg(&big);
        assert_well_formed(&svg);
        assert!(svg.contains("smaller callees not drawn"));
    }

    const ENTITIES: [&str; 5] = ["amp", "lt", "gt", "quot", "#39"];

    /// Checks that every tag is closed in order, attributes are quoted,
    /// and every & starts an entity: enough to catch broken escaping.
    fn assert_well_formed(xml: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = xml;
        while let Some(start) = rest.find(['<', '&']) {
            check_text(&rest[..start]);
            rest = &rest[start..];
            if rest.starts_with('&') {
                let end = rest.find(';').expect("entity without ;");
                let entity = &rest[1..end];
                assert!(ENTITIES.contains(&entity), "bad entity &{entity};");
                rest = &rest[end + 1..];
                continue;
            }
            let end = rest.find('>').expect("unclosed tag");
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            assert!(!tag.contains('<'), "< inside a tag: {tag}");
            assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes: {tag}");
            if tag.starts_with('?') {
                assert!(tag.ends_with('?'));
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "mismatched </{name}>");
                continue;
            }
            let name = tag.split([' ', '\n', '/']).next().unwrap();
            assert!(!name.is_empty(), "empty tag name");
            if !tag.ends_with('/') {
                open.push(name);
            }
            // Inside quoted attributes, & must also start an entity.
            for value in tag.split('"').skip(1).step_by(2) {
                for (at, _) in value.match_indices('&') {
                    let entity = value[at + 1..].split(';').next().unwrap();
                    assert!(ENTITIES.contains(&entity), "bad entity &{entity};");
                }
            }
        }
        check_text(rest);
        assert!(open.is_empty(), "unclosed: {open:?}");
    }

    fn check_text(text: &str) {
        assert!(!text.contains('>'), "raw > in text: {text}");
    }

    /// 200k stacks, 1M frames, more than 200k nodes.
    fn big_stacks(n: usize) -> Vec<FlameStack<'static>> {
        (0..n)
            .map(|k| FlameStack {
                frames: vec![
                    frame("<main>", "app.rb", 1),
                    frame(&format!("Mod{}#dispatch", k % 50), "mod.rb", 2),
                    frame(&format!("Worker#step{}", k % 1000), "worker.rb", 3),
                    frame(&format!("Helper#h{}", k % 7919), "helper.rb", 4),
                    frame(&format!("leaf{k}"), "leaf.rb", (k % 100) as i64),
                ],
                value: (k % 97) as i64 + 1,
            })
            .collect()
    }

    /// `FLAMEGRAPH_SAMPLE_OUT=/tmp/sample.html cargo test --lib -- --ignored
    /// write_sample_page` writes a small page (and the SVG next to it, as
    /// .svg) to look at in a browser; FLAMEGRAPH_BIG_SAMPLE_OUT, a page of
    /// big_input's 200k stacks.
    #[test]
    #[ignore]
    fn write_sample_page() {
        if let Ok(path) = std::env::var("FLAMEGRAPH_BIG_SAMPLE_OUT") {
            let big = input(big_stacks(200_000));
            std::fs::write(&path, render_html(&big)).unwrap();
            let svg_path = std::path::Path::new(&path).with_extension("svg");
            std::fs::write(svg_path, render_svg(&big)).unwrap();
        }
        let Ok(path) = std::env::var("FLAMEGRAPH_SAMPLE_OUT") else {
            return;
        };
        let f = |name: &str, file: &str, line: i64| frame(name, file, line);
        let app = |leaf: Vec<FlameFrame<'static>>, value: i64| -> FlameStack<'static> {
            let mut frames = vec![
                f("<main>", "demo.rb", 40),
                f("App#handle", "app.rb", 12),
                f("PageCache#fetch", "page_cache.rb", 8),
            ];
            frames.extend(leaf);
            FlameStack { frames, value }
        };
        let stacks = vec![
            app(
                vec![
                    f("PageRenderer#render", "renderer.rb", 21),
                    f("String#*", "renderer.rb", 22),
                ],
                4_800_000,
            ),
            app(
                vec![
                    f("PageRenderer#render", "renderer.rb", 21),
                    f("Array#map", "renderer.rb", 30),
                    f("block in PageRenderer#render", "renderer.rb", 31),
                    f("String#+", "renderer.rb", 31),
                ],
                1_200_000,
            ),
            app(vec![f("Hash#[]=", "page_cache.rb", 9)], 330_000),
            FlameStack {
                frames: vec![
                    f("<main>", "demo.rb", 40),
                    f("App#handle", "app.rb", 14),
                    f("Logger#info", "logger.rb", 3),
                    f("String#*", "logger.rb", 4),
                ],
                value: 400_000,
            },
            FlameStack {
                frames: vec![
                    f("<main>", "demo.rb", 2),
                    f("Kernel#require", "<internal:rubygems>", 0),
                    f("block in <class:Config> \"&' </script>", "config.rb", 5),
                    f("Émoji 🔥#load", "config.rb", 6),
                ],
                value: 90_000,
            },
        ];
        let total = stacks.iter().map(|s| s.value).sum();
        let sample = FlameGraphInput::new(
            "heap-1234-5.pprof".to_string(),
            format!(
                "inuse_space · {} total · taken 2026-11-30 01:02:03 UTC",
                format_value(total, "bytes")
            ),
            "inuse_space".to_string(),
            "bytes".to_string(),
            stacks,
        );
        std::fs::write(&path, render_html(&sample)).unwrap();
        let svg_path = std::path::Path::new(&path).with_extension("svg");
        std::fs::write(svg_path, render_svg(&sample)).unwrap();
    }
}
