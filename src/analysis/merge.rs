//! `merge`: one profile from many (say, every worker of a server). Strings,
//! functions, mappings and locations are interned again into one set of
//! tables; samples with the same stack and labels are added up.

use crate::analysis::{InputMap, InputSet};
use crate::pprof;
use crate::pprof::string_table::StringTable;

use super::decoded_profile::{memory_estimate, read_back_estimate, DecodedProfile, ViewError};
use super::display::shown;
use super::read_budget::{megabytes, ReadBudget};

/// The merged profile's string table, keyed by SipHash: its strings come
/// from files anybody may have crafted.
type Strings = StringTable<std::collections::hash_map::RandomState>;

/// One profile's string indexes interned into the merged table, each
/// string once: a name can be long and used by every function or label,
/// and must not be hashed at each use.
struct ProfileStrings<'p> {
    profile: &'p DecodedProfile,
    merged: Vec<i64>,
}

impl<'p> ProfileStrings<'p> {
    fn new(profile: &'p DecodedProfile) -> Self {
        ProfileStrings {
            profile,
            merged: vec![-1; profile.raw.string_table.len()],
        }
    }

    fn id(&mut self, strings: &mut Strings, index: i64) -> i64 {
        // Indexes were checked when the profile was decoded.
        let Some(slot) = usize::try_from(index)
            .ok()
            .and_then(|i| self.merged.get_mut(i))
        else {
            return strings.intern(self.profile.string(index as u32));
        };
        if *slot < 0 {
            *slot = strings.intern(self.profile.string(index as u32));
        }
        *slot
    }
}

type FunctionKey = (i64, i64, i64, i64);
type MappingKey = (i64, i64, u64, u64, u64);
type LocationKey = (u64, u64, Vec<(u64, i64, i64)>, bool);
type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);

/// `merge`, read back as a profile, within `budget`: the sum of the
/// inputs' estimates is reserved first (the merged profile and its indexes
/// take at most that), then only the result's estimate is kept. A result
/// that could not be read back from its file under the same limit is
/// refused: merge never writes what the readers refuse.
pub fn merge_within(
    profiles: &[&DecodedProfile],
    budget: &'static ReadBudget,
) -> Result<DecodedProfile, ViewError> {
    let inputs = profiles
        .iter()
        .map(|profile| profile.reserved_bytes().max(memory_estimate(&profile.raw)))
        .fold(0u64, u64::saturating_add);
    let mut reservation = budget
        .reserve(inputs)
        .map_err(|refused| ViewError::Memory(format!("merging these profiles {refused}")))?;
    let merged = merge(profiles).map_err(ViewError::Argument)?;
    let read_back = read_back_estimate(&merged);
    if read_back > budget.limit() {
        return Err(ViewError::Memory(format!(
            "the merged profile would take about {} of memory to read back (limit {}); merge fewer profiles",
            megabytes(read_back),
            megabytes(budget.limit())
        )));
    }
    let estimate = memory_estimate(&merged);
    let mut profile = DecodedProfile::from_raw(merged)
        .map_err(|error| ViewError::Argument(format!("the merged profile is invalid: {error}")))?;
    reservation.shrink_to(estimate);
    profile.hold(reservation);
    Ok(profile)
}

pub fn merge(profiles: &[&DecodedProfile]) -> Result<pprof::Profile, String> {
    let Some(first) = profiles.first() else {
        return Err("merge needs at least one profile".to_string());
    };
    let types = first.sample_types();
    let mut strings = Strings::new();
    let mut out = pprof::Profile {
        sample_type: types
            .iter()
            .map(|(t, u)| pprof::ValueType {
                r#type: strings.intern(t),
                unit: strings.intern(u),
            })
            .collect(),
        ..Default::default()
    };

    let mut functions: InputMap<FunctionKey, u64> = InputMap::default();
    let mut mappings: InputMap<MappingKey, u64> = InputMap::default();
    let mut locations: InputMap<LocationKey, u64> = InputMap::default();
    let mut samples: InputMap<SampleKey, Vec<i64>> = InputMap::default();
    let mut sample_order: Vec<SampleKey> = Vec::new();
    let mut comments: Vec<String> = Vec::new();
    let mut seen_comments: InputSet<String> = InputSet::default();
    let (mut start, mut end) = (i64::MAX, i64::MIN);

    for (position, profile) in profiles.iter().enumerate() {
        // Values are matched by sample type name: another order is fine,
        // another set of types is not.
        let own = profile.sample_types();
        let value_map: Vec<usize> = types
            .iter()
            .map(|wanted| own.iter().position(|t| t == wanted))
            .collect::<Option<Vec<usize>>>()
            .filter(|_| own.len() == types.len())
            .ok_or_else(|| {
                let describe = |ts: &[(String, String)]| {
                    ts.iter()
                        .map(|(t, u)| format!("{}/{}", shown(t), shown(u)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                format!(
                    "profile {} has sample types {} but profile 1 has {}: only profiles of one kind can be merged",
                    position + 1,
                    describe(&own),
                    describe(&types)
                )
            })?;
        let raw = &profile.raw;
        let mut own_strings = ProfileStrings::new(profile);

        let mut function_ids: InputMap<u64, u64> = InputMap::default();
        for function in &raw.function {
            let key = (
                own_strings.id(&mut strings, function.name),
                own_strings.id(&mut strings, function.system_name),
                own_strings.id(&mut strings, function.filename),
                function.start_line,
            );
            let next = out.function.len() as u64 + 1;
            let id = *functions.entry(key).or_insert_with(|| {
                out.function.push(pprof::Function {
                    id: next,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                });
                next
            });
            function_ids.insert(function.id, id);
        }

        let mut mapping_ids: InputMap<u64, u64> = InputMap::default();
        for mapping in &raw.mapping {
            let key = (
                own_strings.id(&mut strings, mapping.filename),
                own_strings.id(&mut strings, mapping.build_id),
                mapping.memory_start,
                mapping.memory_limit,
                mapping.file_offset,
            );
            let next = out.mapping.len() as u64 + 1;
            let id = *mappings.entry(key).or_insert_with(|| {
                out.mapping.push(pprof::Mapping {
                    id: next,
                    memory_start: key.2,
                    memory_limit: key.3,
                    file_offset: key.4,
                    filename: key.0,
                    build_id: key.1,
                    ..*mapping
                });
                next
            });
            mapping_ids.insert(mapping.id, id);
        }

        let mut location_ids: InputMap<u64, u64> = InputMap::default();
        for location in &raw.location {
            let lines: Vec<(u64, i64, i64)> = location
                .line
                .iter()
                .map(|l| (function_ids[&l.function_id], l.line, l.column))
                .collect();
            let mapping = if location.mapping_id == 0 {
                0
            } else {
                mapping_ids[&location.mapping_id]
            };
            let key = (mapping, location.address, lines, location.is_folded);
            let next = out.location.len() as u64 + 1;
            let id = *locations.entry(key).or_insert_with_key(|key| {
                out.location.push(pprof::Location {
                    id: next,
                    mapping_id: key.0,
                    address: key.1,
                    line: key
                        .2
                        .iter()
                        .map(|(function_id, line, column)| pprof::Line {
                            function_id: *function_id,
                            line: *line,
                            column: *column,
                        })
                        .collect(),
                    is_folded: key.3,
                });
                next
            });
            location_ids.insert(location.id, id);
        }

        for sample in &raw.sample {
            let stack: Vec<u64> = sample
                .location_id
                .iter()
                .map(|id| location_ids[id])
                .collect();
            let mut labels: Vec<(i64, i64, i64, i64)> = sample
                .label
                .iter()
                .map(|l| {
                    (
                        own_strings.id(&mut strings, l.key),
                        own_strings.id(&mut strings, l.str),
                        l.num,
                        own_strings.id(&mut strings, l.num_unit),
                    )
                })
                .collect();
            labels.sort_unstable();
            let key = (stack, labels);
            let sums = match samples.get_mut(&key) {
                Some(sums) => sums,
                None => {
                    sample_order.push(key.clone());
                    samples.entry(key).or_insert_with(|| vec![0; types.len()])
                }
            };
            for (sum, from) in sums.iter_mut().zip(&value_map) {
                *sum = sum.saturating_add(sample.value[*from]);
            }
        }

        for comment in profile.comments() {
            if seen_comments.insert(comment.to_string()) {
                comments.push(comment.to_string());
            }
        }
        if raw.time_nanos > 0 {
            start = start.min(raw.time_nanos);
            end = end.max(raw.time_nanos.saturating_add(raw.duration_nanos.max(0)));
        }
    }

    for key in sample_order {
        let value = samples.remove(&key).unwrap_or_default();
        let (location_id, labels) = key;
        out.sample.push(pprof::Sample {
            location_id,
            value,
            label: labels
                .into_iter()
                .map(|(key, str, num, num_unit)| pprof::Label {
                    key,
                    str,
                    num,
                    num_unit,
                })
                .collect(),
        });
    }
    if start != i64::MAX {
        out.time_nanos = start;
        out.duration_nanos = end.saturating_sub(start);
    }
    let raw = &first.raw;
    if let Some(period_type) = &raw.period_type {
        out.period_type = Some(pprof::ValueType {
            r#type: strings.intern(first.string(period_type.r#type as u32)),
            unit: strings.intern(first.string(period_type.unit as u32)),
        });
    }
    out.period = raw.period;
    out.drop_frames = strings.intern(first.string(raw.drop_frames as u32));
    out.keep_frames = strings.intern(first.string(raw.keep_frames as u32));
    out.default_sample_type = strings.intern(first.string(raw.default_sample_type as u32));
    comments.insert(
        0,
        format!("memprofiler_pprof_rs merge: {} profiles", profiles.len()),
    );
    out.comment = comments.iter().map(|c| strings.intern(c)).collect();
    out.string_table = strings.into_strings();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::decoded_profile::tests::profile_from;

    const TYPES: &[(&str, &str)] = &[("alloc_space", "bytes"), ("inuse_space", "bytes")];

    fn decoded_within(raw: &pprof::Profile, budget: &'static ReadBudget) -> DecodedProfile {
        use prost::Message;
        DecodedProfile::decode_within(&raw.encode_to_vec(), budget).unwrap()
    }

    #[test]
    fn merging_reserves_its_inputs_then_keeps_the_result() {
        use crate::test_support::counting_alloc::peak_bytes_during;
        let samples: Vec<(String, i64)> = (0..2_000).map(|k| (format!("M#m{k}"), k)).collect();
        let raw = |shift: i64| {
            let stacks: Vec<[(&str, &str, i64); 1]> = samples
                .iter()
                .map(|(name, line)| [(name.as_str(), "m.rb", line + shift)])
                .collect();
            let list: Vec<crate::analysis::decoded_profile::tests::TestSample> = stacks
                .iter()
                .map(|stack| (&stack[..], &[1i64, 1][..], None))
                .collect();
            profile_from(TYPES, &list)
        };
        let budget = crate::analysis::read_budget::test_budget(1 << 30);
        let inputs: Vec<DecodedProfile> = (0..4).map(|k| decoded_within(&raw(k), budget)).collect();
        let list: Vec<&DecodedProfile> = inputs.iter().collect();
        let held = budget.held();
        let (merged, peak) = peak_bytes_during(|| merge_within(&list, budget).unwrap());
        assert!(
            peak as u64 <= held,
            "{peak} bytes allocated, {held} reserved"
        );
        assert_eq!(merged.sample_count(), 8_000);
        assert_eq!(budget.held(), held + merged.reserved_bytes());
        assert_eq!(merged.reserved_bytes(), memory_estimate(&merged.raw));
        drop(merged);
        assert_eq!(budget.held(), held);
    }

    #[test]
    fn merging_past_the_limit_or_into_an_unreadable_file_is_refused() {
        let big = "B#".to_string() + &"b".repeat(4 << 20);
        let raw = profile_from(TYPES, &[(&[(big.as_str(), "b.rb", 1)], &[1, 1], None)]);
        let one = memory_estimate(&raw);
        // Room to read it and reserve a merge of it, but not to read the
        // merged file back (its bytes count too).
        let budget = crate::analysis::read_budget::test_budget(3 * one);
        let input = decoded_within(&raw, budget);
        let error = merge_within(&[&input], budget).err().unwrap();
        let ViewError::Memory(message) = error else {
            panic!("{error:?}")
        };
        assert!(message.contains("to read back"), "{message}");
        assert_eq!(
            budget.held(),
            input.reserved_bytes(),
            "a refusal keeps nothing"
        );
        budget.set_limit(one + one / 2);
        let error = merge_within(&[&input], budget).err().unwrap();
        assert!(
            matches!(&error, ViewError::Memory(m) if m.starts_with("merging these profiles would take")),
            "{error:?}"
        );
    }

    #[test]
    fn same_stacks_add_up_and_others_are_kept() {
        let a = DecodedProfile::from_raw(profile_from(
            TYPES,
            &[
                (
                    &[("A#x", "a.rb", 1), ("A#run", "a.rb", 9)],
                    &[10, 1],
                    Some("String"),
                ),
                (&[("A#y", "a.rb", 2)], &[5, 0], None),
            ],
        ))
        .unwrap();
        let b = DecodedProfile::from_raw(profile_from(
            TYPES,
            &[
                (&[("B#z", "b.rb", 7)], &[3, 3], Some("Hash")),
                (
                    &[("A#x", "a.rb", 1), ("A#run", "a.rb", 9)],
                    &[20, 2],
                    Some("String"),
                ),
            ],
        ))
        .unwrap();
        let merged = DecodedProfile::from_raw(merge(&[&a, &b]).unwrap()).unwrap();
        assert_eq!(merged.sample_count(), 3);
        let find = |leaf: &str| {
            (0..merged.sample_count())
                .find(|s| merged.string(merged.stack(*s).next().unwrap().name) == leaf)
                .map(|s| merged.raw.sample[s].value.clone())
                .unwrap()
        };
        assert_eq!(find("A#x"), [30, 3]);
        assert_eq!(find("B#z"), [3, 3]);
        assert_eq!(find("A#y"), [5, 0]);
        assert_eq!(
            merged.raw.function.len(),
            4,
            "A#x, A#run, A#y, B#z once each"
        );
        assert!(merged.comments()[0].contains("2 profiles"));
    }

    #[test]
    fn value_order_is_matched_by_name_and_other_kinds_refused() {
        let a = DecodedProfile::from_raw(profile_from(TYPES, &[(&[("f", "", 0)], &[1, 2], None)]))
            .unwrap();
        let swapped = DecodedProfile::from_raw(profile_from(
            &[("inuse_space", "bytes"), ("alloc_space", "bytes")],
            &[(&[("f", "", 0)], &[20, 10], None)],
        ))
        .unwrap();
        let merged = merge(&[&a, &swapped]).unwrap();
        assert_eq!(merged.sample[0].value, [11, 22]);
        let cpu = DecodedProfile::from_raw(profile_from(&[("cpu", "nanoseconds")], &[])).unwrap();
        let error = merge(&[&a, &cpu]).unwrap_err();
        assert!(
            error.starts_with("profile 2 has sample types cpu/nanoseconds but profile 1 has"),
            "{error}"
        );
    }

    #[test]
    fn time_spans_all_inputs() {
        let mut first = profile_from(TYPES, &[]);
        first.time_nanos = 1_000;
        first.duration_nanos = 100;
        let mut second = profile_from(TYPES, &[]);
        second.time_nanos = 2_000;
        second.duration_nanos = 500;
        let (a, b) = (
            DecodedProfile::from_raw(first).unwrap(),
            DecodedProfile::from_raw(second).unwrap(),
        );
        let merged = merge(&[&b, &a]).unwrap();
        assert_eq!((merged.time_nanos, merged.duration_nanos), (1_000, 1_500));
    }
}
