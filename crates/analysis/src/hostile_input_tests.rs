//! Profiles made to hurt the reader: the reproducers of a security review
//! (a 1 KB file expanding to a billion frames, millions of empty labels,
//! a 20 MB name used by every frame, terminal escapes in names), each with
//! what must happen instead, and a fuzz test that mutates them and checks
//! that every view ends, without a panic, in bounded memory.
//!
//! The fuzz test is ignored by a plain `cargo test` (it runs for a while);
//! script/test runs it, in release mode, with `cargo test --release -p
//! memprofiler_pprof_analysis --lib fuzzed -- --ignored`, for MEMPROFILER_FUZZ_SECONDS (default 10) from a
//! seed printed at the end and on failure; MEMPROFILER_FUZZ_SEED repeats a
//! run.

use std::io::Write;
use std::time::{Duration, Instant};

use prost::Message;
use rand::{rngs::StdRng, RngExt, SeedableRng};

use super::decoded_profile::{DecodedProfile, ReadError};
use super::diff::{render_diff, DiffOptions};
use super::display::MAX_SHOWN_CHARS;
use super::flamegraph::{flame_graph_of, render_html, render_svg};
use super::grouping::GroupBy;
use super::merge::{merge, merge_within};
use super::read_budget::test_budget;
use super::top::{render_top, TopOptions};
use test_support::counting_alloc::peak_bytes_during;
use test_support::miri_scaled;

/// A profile with one sample type, functions named `names` (function k
/// is `names[k]`; equal names are one string), locations of the given
/// lines ([(function, line)] each, innermost first) and samples listing
/// locations (1-based ids).
fn profile(names: &[&str], locations: &[Vec<(u64, i64)>], samples: &[Vec<u64>]) -> pprof::Profile {
    let mut strings = vec![
        String::new(),
        "inuse_space".to_string(),
        "bytes".to_string(),
        "app.rb".to_string(),
    ];
    let mut name_index = Vec::new();
    for name in names {
        let index = match strings.iter().position(|s| s == name) {
            Some(index) => index,
            None => {
                strings.push(name.to_string());
                strings.len() - 1
            }
        };
        name_index.push(index as i64);
    }
    pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        function: name_index
            .iter()
            .enumerate()
            .map(|(k, &name)| pprof::Function {
                id: k as u64 + 1,
                name,
                system_name: 0,
                filename: 3,
                start_line: 1,
            })
            .collect(),
        location: locations
            .iter()
            .enumerate()
            .map(|(k, lines)| pprof::Location {
                id: k as u64 + 1,
                line: lines
                    .iter()
                    .map(|&(function, line)| pprof::Line {
                        function_id: function,
                        line,
                        column: 0,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        sample: samples
            .iter()
            .map(|ids| pprof::Sample {
                location_id: ids.clone(),
                value: vec![100],
                label: Vec::new(),
            })
            .collect(),
        string_table: strings,
        ..Default::default()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("gzip to memory");
    encoder.finish().expect("gzip to memory")
}

/// One location of `lines` inlined frames, listed `repeats` times by each
/// of `samples` samples: about 10 bytes on the wire, but `lines * repeats`
/// frames per stack.
fn inlined_bomb(lines: usize, repeats: usize, samples: usize) -> Vec<u8> {
    let location = vec![(1, 7); lines];
    let raw = profile(
        &["Bomb#inline"],
        &[location],
        &vec![vec![1; repeats]; samples],
    );
    gzip(&raw.encode_to_vec())
}

/// Every view a reader offers, on `bytes`: what the CLI, Profile and
/// RackApp do with a file. Returns the texts, or the decoding error.
fn read_everything(bytes: &[u8]) -> Result<Vec<String>, ReadError> {
    let profile = DecodedProfile::decode(bytes)?;
    let mut texts = Vec::new();
    for by in [
        GroupBy::Function,
        GroupBy::Line,
        GroupBy::Class,
        GroupBy::File,
        GroupBy::Gem,
    ] {
        let options = TopOptions {
            by,
            limit: 5,
            ..TopOptions::default()
        };
        texts.push(render_top(&profile, &options).unwrap_or_else(|e| e));
    }
    let everything = TopOptions {
        limit: 0,
        sort_by_cum: true,
        ..TopOptions::default()
    };
    texts.push(render_top(&profile, &everything).unwrap_or_else(|e| e));
    texts.push(render_diff(&[&profile, &profile], &DiffOptions::default()).unwrap_or_else(|e| e));
    if let Ok(input) = flame_graph_of(&profile, None, "fuzz".to_string()) {
        texts.push(render_html(&input));
        texts.push(render_svg(&input));
    }
    if let Ok(merged) = merge(&[&profile, &profile]) {
        if let Ok(again) = DecodedProfile::from_raw(merged) {
            texts.push(format!("merged {} samples", again.sample_count()));
        }
    }
    if let Ok(pprof) = profile.to_pprof(None) {
        texts.push(format!("{} bytes re-encoded", pprof.bytes.len()));
    }
    Ok(texts)
}

#[test]
fn a_1_kb_profile_of_a_billion_inlined_frames_is_refused() {
    let one = inlined_bomb(100_000, 10_000, 1);
    let ten = inlined_bomb(100_000, 10_000, 10);
    assert!(
        one.len() < 2_000 && ten.len() < 2_000,
        "{} {}",
        one.len(),
        ten.len()
    );
    for bytes in [one, ten] {
        let (result, peak) = peak_bytes_during(|| read_everything(&bytes));
        let error = result.expect_err("refused");
        assert!(matches!(error, ReadError::TooComplex(_)), "{error}");
        assert!(
            error.to_string().contains("frames")
                && error.to_string().ends_with("refusing to read it"),
            "{error}"
        );
        // Decoding the location's 100,000 lines, not the stack's billion.
        assert!(peak < 64 << 20, "{peak} bytes");
    }
}

#[test]
fn a_deep_but_allowed_stack_is_read_in_memory_of_its_locations() {
    // 10 stacks of 500,000 frames (under both limits): every view works
    // from the location lists (1,000 ids each), not the expanded stacks.
    let bytes = inlined_bomb(miri_scaled(500), miri_scaled(1_000), 10);
    let (texts, peak) = peak_bytes_during(|| read_everything(&bytes).expect("readable"));
    assert!(texts[0].contains("Bomb#inline"), "{}", texts[0]);
    assert!(peak < 48 << 20, "{peak} bytes");
}

#[test]
fn millions_of_empty_labels_or_samples_are_refused_before_decoding() {
    // 20 million empty labels in one sample (2 bytes each on the wire, 32
    // in memory): 40 MB of protobuf, 1.3 GB decoded.
    let labels = miri_scaled(20_000_000);
    let mut raw = profile(&["A#a"], &[vec![(1, 1)]], &[vec![1]]);
    raw.sample[0].label = vec![pprof::Label::default(); labels];
    let bytes = raw.encode_to_vec();
    // 5 million tiny samples: 10 MB on the wire, 1.1 GB decoded.
    let samples = miri_scaled(5_000_000);
    let mut tiny = profile(&["A#a"], &[vec![(1, 1)]], &[]);
    tiny.sample = vec![pprof::Sample::default(); samples];
    let tiny_bytes = tiny.encode_to_vec();
    for bytes in [bytes, tiny_bytes] {
        let budget = test_budget(1 << 30);
        let (result, peak) =
            peak_bytes_during(|| DecodedProfile::decode_within(&bytes, budget).err());
        if cfg!(miri) {
            continue; // scaled down below the limit
        }
        let error = result.expect("refused");
        assert!(
            matches!(error, ReadError::OverBudget(refused) if refused.needed > 1 << 30),
            "{error}"
        );
        assert!(peak < 1 << 20, "refused before decoding: {peak} bytes");
    }
}

#[test]
fn a_huge_name_used_by_every_frame_is_hashed_once_and_shown_cut() {
    // A 20 MB name for 200 functions at 200 lines: copying or hashing it
    // per frame (as the views once did) would be 4 GB of work.
    let name = "N".repeat(miri_scaled(20 << 20));
    let names: Vec<&str> = vec![name.as_str(); 200];
    let locations: Vec<Vec<(u64, i64)>> =
        (0..200).map(|k| vec![(k as u64 + 1, k as i64)]).collect();
    let samples: Vec<Vec<u64>> = (0..200).map(|k| vec![k as u64 + 1, 1]).collect();
    let bytes = gzip(&profile(&names, &locations, &samples).encode_to_vec());
    let (texts, peak) = peak_bytes_during(|| read_everything(&bytes).expect("readable"));
    for text in &texts {
        assert!(
            !text.contains(&name[..MAX_SHOWN_CHARS + 1]),
            "a name shown whole"
        );
    }
    assert!(texts[0].contains(&format!("{}…", &name[..MAX_SHOWN_CHARS])));
    // The profile itself (the name, decoded and re-encoded by to_pprof and
    // merge) and little else.
    assert!(peak < 8 * name.len() + (32 << 20), "{peak} bytes");
}

#[test]
fn terminal_escapes_in_names_are_shown_escaped() {
    let hostile = "Evil\u{1b}]0;owned\u{7}\u{1b}[2J\r#name";
    let bytes = profile(&[hostile], &[vec![(1, 1)]], &[vec![1]]).encode_to_vec();
    let texts = read_everything(&bytes).expect("readable");
    for text in &texts[..7] {
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "raw control character in {text:?}"
        );
    }
    assert!(
        texts[0].contains("Evil\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\r#name"),
        "{}",
        texts[0]
    );
}

#[test]
fn a_group_cannot_hide_what_follows_from_the_estimate() {
    // proto2 groups, which prost skips, once stopped the estimate: 2 bytes
    // in front of 20 million empty labels got them decoded.
    let mut raw = profile(&["A#a"], &[vec![(1, 1)]], &[vec![1]]);
    raw.sample[0].label = vec![pprof::Label::default(); miri_scaled(1_000)];
    let mut bytes = vec![(100 << 3) | 3, 6, (100 << 3) | 4, 6];
    bytes.extend(raw.encode_to_vec());
    let error = DecodedProfile::decode(&bytes).err().expect("refused");
    assert!(error.to_string().contains("protobuf groups"), "{error}");
}

#[test]
fn a_long_name_named_many_times_is_copied_at_most_once_per_use_shown() {
    // A 1 MB binary name for 300 unsymbolized locations, 300 comments and
    // one sample: each location's name once held the whole binary name.
    let big = "B".repeat(miri_scaled(1 << 20));
    let mut raw = profile(&["A#a"], &[vec![(1, 1)]], &[]);
    raw.string_table.push(big.clone());
    let big_index = raw.string_table.len() as i64 - 1;
    raw.mapping.push(pprof::Mapping {
        id: 1,
        filename: big_index,
        ..Default::default()
    });
    raw.location.extend((0..300).map(|k| pprof::Location {
        id: 2 + k,
        mapping_id: 1,
        address: 0x1000 + k,
        ..Default::default()
    }));
    raw.sample.push(pprof::Sample {
        location_id: (2..302).collect(),
        value: vec![1],
        label: Vec::new(),
    });
    raw.comment = vec![big_index; 300];
    let bytes = gzip(&raw.encode_to_vec());
    let (texts, peak) = peak_bytes_during(|| read_everything(&bytes).expect("readable"));
    // The profile (twice: to_pprof and merge re-encode it) and little else.
    assert!(peak < 6 * big.len() + (16 << 20), "{peak} bytes");
    let profile = DecodedProfile::decode(&bytes).expect("readable");
    assert_eq!(profile.comments().len(), 1);
    let leaf = profile.stack(0).next().expect("a frame");
    assert!(
        profile.string(leaf.name).len() < 300,
        "{}",
        profile.string(leaf.name).len()
    );
    assert!(texts[0].contains("BBBB…"), "{}", texts[0]);
}

#[test]
fn many_or_long_sample_types_are_refused() {
    let mut raw = profile(&["A#a"], &[vec![(1, 1)]], &[vec![1]]);
    raw.sample_type = vec![pprof::ValueType { r#type: 1, unit: 2 }; 400];
    raw.sample[0].value = vec![1; 400];
    let error = DecodedProfile::decode(&raw.encode_to_vec())
        .err()
        .expect("refused");
    assert!(error.to_string().contains("400 sample types"), "{error}");
    let mut raw = profile(&["A#a"], &[vec![(1, 1)]], &[vec![1]]);
    raw.string_table[1] = "t".repeat(10_000);
    let error = DecodedProfile::decode(&raw.encode_to_vec())
        .err()
        .expect("refused");
    assert!(error.to_string().contains("10000 bytes"), "{error}");
}

#[test]
fn rows_tied_by_the_thousand_are_labelled_in_bounded_memory() {
    // One location of 50,000 lines (all tied in value) of a function whose
    // name is 500 control characters (each shown as a 6-byte escape): only
    // the rows shown may keep a label.
    let name = "\u{1}".repeat(500);
    let lines: Vec<(u64, i64)> = (0..miri_scaled(50_000)).map(|k| (1, k as i64)).collect();
    let bytes = gzip(&profile(&[&name], &[lines], &[vec![1]]).encode_to_vec());
    let profile = DecodedProfile::decode(&bytes).expect("readable");
    let options = TopOptions {
        by: GroupBy::Line,
        limit: 5,
        ..TopOptions::default()
    };
    let (text, peak) = peak_bytes_during(|| render_top(&profile, &options).expect("a table"));
    assert_eq!(text.matches("\\u{1}").count(), 5 * 500);
    assert!(peak < 16 << 20, "{peak} bytes");
}

/// The fuzz test's inputs before mutation: the reproducers (scaled down so
/// a mutation of them decodes now and then) and ordinary profiles.
fn seed_corpus() -> Vec<Vec<u8>> {
    let ordinary = profile(
        &["A#a", "B#b", "String#*"],
        &[vec![(3, 5)], vec![(1, 10)], vec![(2, 20), (1, 11)]],
        &[vec![1, 2], vec![3, 2], vec![2]],
    );
    let name = "L".repeat(100_000);
    vec![
        ordinary.encode_to_vec(),
        gzip(&ordinary.encode_to_vec()),
        inlined_bomb(100_000, 10_000, 1),
        inlined_bomb(300, 1_000, 3),
        profile(
            &[&name, &name],
            &[vec![(1, 1)], vec![(2, 2)]],
            &[vec![1, 2]],
        )
        .encode_to_vec(),
        profile(&["E\u{1b}[31m\u{7}"], &[vec![(1, 1)]], &[vec![1]]).encode_to_vec(),
    ]
}

/// One random change: flip bytes, duplicate a slice (repeated fields, more
/// samples), insert a large varint or a protobuf group, or cut the end.
fn mutate(bytes: &mut Vec<u8>, random: &mut StdRng) {
    if bytes.is_empty() {
        bytes.push(random.random());
        return;
    }
    let at = random.random_range(0..bytes.len());
    match random.random_range(0..6) {
        0 => bytes[at] = random.random(),
        1 => bytes[at] ^= 1 << random.random_range(0..8),
        2 => {
            let end = (at + random.random_range(1..64)).min(bytes.len());
            let copies = random.random_range(1..200);
            let slice = bytes[at..end].to_vec();
            for _ in 0..copies {
                bytes.splice(at..at, slice.iter().copied());
            }
        }
        3 => {
            let value: u64 = random.random::<u64>() >> random.random_range(0..64);
            let mut varint = Vec::new();
            prost::encoding::encode_varint(value, &mut varint);
            bytes.splice(at..at, varint);
        }
        4 => {
            let field = random.random_range(1..20u8);
            bytes.splice(at..at, [(field << 3) | 3, (field << 3) | 4]);
        }
        _ => bytes.truncate(at),
    }
}

/// A valid but random profile: repeated and control-character strings,
/// now and then a long one; inlined locations; samples repeating
/// locations; extreme and negative values; labels. Mutation alone rarely
/// keeps protobuf readable; this reaches the views every time.
fn random_profile(random: &mut StdRng) -> Vec<u8> {
    let mut pick = |n: usize, rare: usize| {
        if random.random_ratio(1, 20) {
            random.random_range(0..=rare)
        } else {
            random.random_range(0..=n)
        }
    };
    let string_count = 3 + pick(40, 400);
    let lengths: Vec<usize> = (0..string_count).map(|_| pick(12, 100_000)).collect();
    let function_count = 1 + pick(20, 300);
    let location_count = 1 + pick(40, 400);
    let lines: Vec<usize> = (0..location_count).map(|_| pick(3, 2_000)).collect();
    let sample_count = pick(60, 1_000);
    let depths: Vec<usize> = (0..sample_count).map(|_| pick(12, 2_000)).collect();
    let type_count = 1 + pick(3, 8);
    let mapping_count = pick(2, 20);
    let comment_count = pick(3, 400);
    let alphabet = [
        'a', 'Z', '#', '/', '\u{1b}', '\u{7}', '\r', 'é', '🔥', '<', '&', '"',
    ];
    let strings: Vec<String> = std::iter::once(String::new())
        .chain(lengths.iter().skip(1).map(|&n| {
            (0..n)
                .map(|_| alphabet[random.random_range(0..alphabet.len())])
                .collect()
        }))
        .collect();
    let string = |random: &mut StdRng| random.random_range(0..string_count) as i64;
    let value = |random: &mut StdRng| match random.random_range(0..6) {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => -random.random_range(0..1_000i64),
        _ => random.random_range(0..1_000_000i64),
    };
    let raw = pprof::Profile {
        mapping: (0..mapping_count)
            .map(|k| pprof::Mapping {
                id: k as u64 + 1,
                filename: string(random),
                build_id: string(random),
                ..Default::default()
            })
            .collect(),
        comment: (0..comment_count).map(|_| string(random)).collect(),
        sample_type: (0..type_count)
            .map(|_| pprof::ValueType {
                r#type: string(random),
                unit: string(random),
            })
            .collect(),
        function: (0..function_count)
            .map(|k| pprof::Function {
                id: k as u64 + 1,
                name: string(random),
                system_name: string(random),
                filename: string(random),
                start_line: random.random_range(0..3),
            })
            .collect(),
        location: lines
            .iter()
            .enumerate()
            .map(|(k, &n)| pprof::Location {
                id: k as u64 + 1,
                mapping_id: if mapping_count > 0 && random.random_bool(0.3) {
                    random.random_range(1..=mapping_count as u64)
                } else {
                    0
                },
                address: random.random(),
                line: (0..n)
                    .map(|_| pprof::Line {
                        function_id: random.random_range(1..=function_count as u64),
                        line: random.random_range(-2..100),
                        column: 0,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        sample: depths
            .iter()
            .map(|&depth| pprof::Sample {
                location_id: (0..depth)
                    .map(|_| random.random_range(1..=location_count as u64))
                    .collect(),
                value: (0..type_count).map(|_| value(random)).collect(),
                label: (0..random.random_range(0..3))
                    .map(|_| pprof::Label {
                        key: string(random),
                        str: string(random),
                        num: value(random),
                        num_unit: string(random),
                    })
                    .collect(),
            })
            .collect(),
        default_sample_type: string(random),
        string_table: strings,
        ..Default::default()
    };
    raw.encode_to_vec()
}

/// One fuzz case's bytes: a random profile (now and then mutated) or a
/// mutated one of the corpus, gzipped or not.
fn fuzz_input(random: &mut StdRng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let (mut bytes, mutations) = if random.random_bool(0.5) {
        (
            random_profile(random),
            usize::from(random.random_ratio(1, 5)),
        )
    } else {
        (
            corpus[random.random_range(0..corpus.len())].clone(),
            random.random_range(1..6),
        )
    };
    for _ in 0..mutations {
        mutate(&mut bytes, random);
    }
    if random.random_bool(0.3) {
        gzip(&bytes)
    } else {
        bytes
    }
}

/// MEMPROFILER_FUZZ_SECONDS (default 10) and MEMPROFILER_FUZZ_SEED (a
/// random one if unset).
fn fuzz_settings() -> (u64, u64) {
    let seconds: u64 = std::env::var("MEMPROFILER_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("MEMPROFILER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |t| t.as_nanos() as u64)
        });
    (seconds, seed)
}

#[test]
#[ignore = "runs for MEMPROFILER_FUZZ_SECONDS; script/test runs it in release mode"]
fn fuzzed_profiles_never_panic_and_stay_in_bounded_memory() {
    let (seconds, seed) = fuzz_settings();
    let mut random = StdRng::seed_from_u64(seed);
    let corpus = seed_corpus();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut cases, mut readable) = (0usize, 0usize);
    let (mut max_peak, mut slowest) = (0usize, Duration::ZERO);
    while Instant::now() < deadline && cases < miri_scaled(1_000_000) {
        let input = fuzz_input(&mut random, &corpus);
        let began = Instant::now();
        let outcome = std::panic::catch_unwind(|| peak_bytes_during(|| read_everything(&input)));
        slowest = slowest.max(began.elapsed());
        let Ok((result, peak)) = outcome else {
            panic!(
                "panic on case {cases} of seed {seed} (MEMPROFILER_FUZZ_SEED={seed} repeats it)"
            );
        };
        // Inputs are at most a few MB; no view may need more than a small
        // multiple of what the profile decodes to.
        assert!(
            peak < (256 << 20) + 64 * input.len(),
            "case {cases} of seed {seed} took {peak} bytes for {} input bytes",
            input.len()
        );
        readable += usize::from(result.is_ok());
        max_peak = max_peak.max(peak);
        cases += 1;
    }
    eprintln!(
        "fuzz: {cases} cases, {readable} readable, most memory {} MB, slowest {} ms, seed {seed}",
        max_peak >> 20,
        slowest.as_millis()
    );
    assert!(cases > 0);
}

/// The process may not take more address space than this while the fuzz
/// tests run: a reader that allocated past its budget would then fail to
/// allocate, which aborts the process, as it did the CLI under `ulimit -v`.
const FUZZ_ADDRESS_SPACE: u64 = 6 << 30;

fn limit_address_space() {
    test_support::limit_address_space(FUZZ_ADDRESS_SPACE);
}

/// Sets of fuzzed profiles through merge and diff, as the CLI runs them:
/// read within one budget (a random limit from 1 MB to 256 MB), merged,
/// written and read back. Nothing may panic or abort (the address space
/// is limited), a reader's memory stays within the budget's limit plus
/// what the views render, a merge the budget allowed must read back under
/// the same limit, and every reservation is returned.
#[test]
#[ignore = "runs for MEMPROFILER_FUZZ_SECONDS; script/test runs it in release mode"]
fn fuzzed_profile_sets_merge_and_diff_within_one_budget() {
    limit_address_space();
    let (seconds, seed) = fuzz_settings();
    let mut random = StdRng::seed_from_u64(seed ^ 0x6d65_7267_6500);
    let corpus = seed_corpus();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut cases, mut merged_count, mut refused) = (0usize, 0usize, 0usize);
    let mut max_peak = 0usize;
    while Instant::now() < deadline && cases < miri_scaled(1_000_000) {
        let limit = [1u64 << 20, 16 << 20, 64 << 20, 256 << 20][random.random_range(0..4)];
        let budget = test_budget(limit);
        let inputs: Vec<Vec<u8>> = (0..random.random_range(2..7))
            .map(|_| fuzz_input(&mut random, &corpus))
            .collect();
        let input_bytes: usize = inputs.iter().map(Vec::len).sum();
        let outcome = std::panic::catch_unwind(|| {
            peak_bytes_during(|| {
                let profiles: Vec<DecodedProfile> = inputs
                    .iter()
                    .filter_map(|bytes| DecodedProfile::decode_within(bytes, budget).ok())
                    .collect();
                let list: Vec<&DecodedProfile> = profiles.iter().collect();
                if list.len() >= 2 {
                    let _ = render_diff(&list, &DiffOptions::default());
                }
                if list.is_empty() {
                    return None;
                }
                let merged = merge_within(&list, budget);
                drop(list);
                drop(profiles);
                // As the CLI writes it, its inputs let go: what the merge
                // check allowed must write and read back under the limit.
                Some(merged.map(|merged| {
                    let bytes = merged.to_pprof(None);
                    drop(merged);
                    let written = bytes.expect("a merge the budget allowed can be written");
                    let again = DecodedProfile::decode_within(&written.bytes, budget);
                    assert!(
                        !matches!(again, Err(ReadError::OverBudget(_))),
                        "a merge the budget allowed reads back under its limit: {:?}",
                        again.err()
                    );
                }))
            })
        });
        let Ok((result, peak)) = outcome else {
            panic!(
                "panic on case {cases} of seed {seed} (MEMPROFILER_FUZZ_SEED={seed} repeats it)"
            );
        };
        assert_eq!(
            budget.held(),
            0,
            "case {cases} of seed {seed} kept reservations"
        );
        // What the budget does not cover: the diff's and merge's tables
        // and texts, a small multiple of the inputs.
        assert!(
            (peak as u64) < limit + (256 << 20) + 64 * input_bytes as u64,
            "case {cases} of seed {seed} took {peak} bytes under a limit of {limit}"
        );
        match result {
            Some(Ok(())) => merged_count += 1,
            Some(Err(_)) => refused += 1,
            None => {}
        }
        max_peak = max_peak.max(peak);
        cases += 1;
    }
    eprintln!(
        "fuzz: {cases} sets merged and diffed, {merged_count} merged, {refused} merges refused, most memory {} MB, seed {seed}",
        max_peak >> 20
    );
    assert!(cases > 0);
}
