//! The flame graph's unit tests.

use super::html::{push_json_string, PAGE_CSS, PAGE_JS};
use super::svg::{fit_label, frame_color};
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
    assert!(html
        .contains("<h1>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;&#39;</h1>"));
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
    assert!(svg.contains(
        "<title>PageCache#fetch\napp.rb:3\n900 B (90.0%) inuse_space\nself: 900 B (90.0%)</title>"
    ));
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
        let warm = (205..=255).contains(&r) && (80..=200).contains(&g) && (40..=90).contains(&b);
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
    let n = test_support::miri_scaled(200_000);
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

/// `FLAMEGRAPH_SAMPLE_OUT=/tmp/sample.html cargo test -p memprofiler_pprof_analysis --lib --
/// --ignored write_sample_page` writes a small page (and the SVG next to it, as
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

#[test]
fn a_retention_report_beside_the_profile_is_in_the_page_and_escaped() {
    let stacks = vec![stack(&["main", "Cache#fill"], 10)];
    let plain = render_html(&input(stacks.clone()));
    assert!(!plain.contains("<h2>What holds it</h2>"));
    assert!(plain.contains("\"retainers\":[]"));

    let mut with_report = input(stacks);
    with_report.retainers = vec![RetentionSite {
        site: "Cache#fill (app.rb:3)".to_string(),
        paths: vec!["String: CACHE (constant) -> Array[0] -> String</script><b>".to_string()],
    }];
    let html = render_html(&with_report);
    assert!(html.contains("<h2>What holds it</h2>"));
    let mut expected =
        String::from("\"retainers\":[{\"site\":\"Cache#fill (app.rb:3)\",\"paths\":[");
    push_json_string(
        &mut expected,
        "String: CACHE (constant) -> Array[0] -> String</script><b>",
    );
    expected.push_str("]}]}");
    assert!(html.contains(&expected), "the report's JSON, escaped");
    assert!(!html.contains("String</script><b>"));
}
