//! The interactive page: header, flame graph and table of functions, with
//! the tree as JSON that `page.js` draws on a `<canvas>`.

use std::fmt::Write as _;

use super::tree::{Function, Tree};
use super::{
    cut_note, negative_note, no_samples_message, pruned_note, push_escaped, FlameGraphInput,
};

pub(super) const PAGE_CSS: &str = include_str!("page.css");
pub(super) const PAGE_JS: &str = include_str!("page.js");

/// Nodes in the page's graph at most (a few MB of page); see `Tree::prune`.
const MAX_PAGE_NODES: usize = 200_000;

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
         or Reset zoom to zoom out. Esc resets zoom and search.</p>\n",
    );
    if !input.retainers.is_empty() {
        out.push_str(
            "<h2>What holds it</h2>\n<p id=\"retainers-hint\" class=\"hint\"></p>\n\
             <div id=\"retainers\"></div>\n",
        );
    }
    out.push_str(
        "<h2>Functions</h2>\n\
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

/// Writes `text` as a JSON string that is also safe inside an HTML
/// `<script>` element: `<`, `>` and `&` as \u escapes, so no `</script>` or
/// `<!--` can appear, and U+2028/U+2029 too.
pub(super) fn push_json_string(out: &mut String, text: &str) {
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

/// `texts` as a JSON array of strings (each as `push_json_string` writes it).
fn push_json_strings<'s>(out: &mut String, texts: impl Iterator<Item = &'s str>) {
    out.push('[');
    for (k, text) in texts.enumerate() {
        if k > 0 {
            out.push(',');
        }
        push_json_string(out, text);
    }
    out.push(']');
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
///   "functions": { "name": [...], "file": [...], "flat": [...], "cum": [...] },
///   "retainers": [{ "site": "Foo#bar (app.rb:12)", "paths": ["String: ..."] }] }
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
    push_json_strings(out, tree.strings.iter().map(|s| s.as_ref()));
    out.push_str(",\"nodes\":{");
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
    out.push_str("},\"retainers\":[");
    for (k, site) in input.retainers.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push('{');
        push_json_key(out, "site");
        push_json_string(out, &site.site);
        out.push(',');
        push_json_key(out, "paths");
        push_json_strings(out, site.paths.iter().map(String::as_str));
        out.push('}');
    }
    out.push_str("]}");
}
