//! `merge`: one profile from many (say, every worker of a server). Strings,
//! functions, mappings and locations are interned again into one set of
//! tables; samples with the same stack and labels are added up.
//!
//! A `Merger` takes the profiles one at a time, each interned once, so a
//! merge of many files costs their total size and needs only one of them
//! read at a time (the CLI's `merge`). Within a read budget it reserves,
//! before each profile, the most that profile can add (its records new,
//! every table grown), then keeps only what its tables hold.

use std::mem::size_of;

use prost::Message;

use crate::{InputMap, InputSet};
use pprof::function_errors::is_function_error_comment;
use pprof::string_table::StringTable;
use sampler::heap_size::{
    block_bytes, map_bytes, map_growth, vec_bytes, vec_growth, BLOCK_OVERHEAD,
};

use super::decoded_profile::{DecodedProfile, ViewError};
use super::display::shown;
use super::memory_estimate::{
    location_estimate, memory_estimate, read_back_bytes, read_back_estimate, sample_estimate,
    string_estimate, FUNCTION_ESTIMATE, MAPPING_ESTIMATE,
};
use super::read_budget::{megabytes, ReadBudget, Reservation};

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

/// What the first profile gives the merged one besides its records.
struct Header {
    types: Vec<(String, String)>,
    period_type: Option<(String, String)>,
    period: i64,
    drop_frames: String,
    keep_frames: String,
    default_sample_type: String,
}

/// A merge in progress (see the top).
pub struct Merger {
    header: Option<Header>,
    strings: Strings,
    out: pprof::Profile,
    functions: InputMap<FunctionKey, u64>,
    mappings: InputMap<MappingKey, u64>,
    locations: InputMap<LocationKey, u64>,
    /// A sample's stack and labels -> its index in `out.sample`.
    samples: InputMap<SampleKey, usize>,
    comments: Vec<String>,
    seen_comments: InputSet<String>,
    span: (i64, i64),
    added: usize,
    /// Heap blocks of the keys' and records' vectors (lines, stacks,
    /// labels, values) and of the comments.
    heap_bytes: usize,
    reservation: Option<Reservation>,
    finish_reserved: bool,
    /// The result's `memory_estimate` and encoded size so far, strings
    /// aside (both grow with each new record; values only make the
    /// encoding longer): a lower bound of what reading it back takes.
    result_estimate: u64,
    result_encoded: u64,
    /// Why the result can no longer be read back, once it cannot.
    unreadable: Option<String>,
}

/// Bytes a record of `len` bytes takes in a repeated field.
fn field_bytes(len: usize) -> u64 {
    (1 + prost::encoding::encoded_len_varint(len as u64) + len) as u64
}

const FUNCTION_ENTRY: usize = size_of::<(FunctionKey, u64)>();
const MAPPING_ENTRY: usize = size_of::<(MappingKey, u64)>();
const LOCATION_ENTRY: usize = size_of::<(LocationKey, u64)>();
const SAMPLE_ENTRY: usize = size_of::<(SampleKey, usize)>();
const ID_ENTRY: usize = size_of::<(u64, u64)>();

impl Default for Merger {
    fn default() -> Self {
        Self::new()
    }
}

impl Merger {
    pub fn new() -> Self {
        Merger {
            header: None,
            strings: Strings::new(),
            out: pprof::Profile::default(),
            functions: InputMap::default(),
            mappings: InputMap::default(),
            locations: InputMap::default(),
            samples: InputMap::default(),
            comments: Vec::new(),
            seen_comments: InputSet::default(),
            span: (i64::MAX, i64::MIN),
            added: 0,
            heap_bytes: 0,
            reservation: None,
            finish_reserved: false,
            result_estimate: 0,
            result_encoded: 0,
            unreadable: None,
        }
    }

    /// A merger whose memory is held to `budget`.
    pub fn within(budget: &'static ReadBudget) -> Self {
        let reservation = budget.reserve(0).ok();
        Merger {
            reservation,
            ..Self::new()
        }
    }

    /// Profiles added so far.
    pub fn len(&self) -> usize {
        self.added
    }

    pub fn is_empty(&self) -> bool {
        self.added == 0
    }

    /// Heap bytes the merger holds.
    pub fn memory_bytes(&self) -> u64 {
        let out = &self.out;
        let tables = map_bytes(self.functions.capacity(), FUNCTION_ENTRY)
            + map_bytes(self.mappings.capacity(), MAPPING_ENTRY)
            + map_bytes(self.locations.capacity(), LOCATION_ENTRY)
            + map_bytes(self.samples.capacity(), SAMPLE_ENTRY)
            + map_bytes(self.seen_comments.capacity(), size_of::<String>())
            + vec_bytes(&out.function)
            + vec_bytes(&out.mapping)
            + vec_bytes(&out.location)
            + vec_bytes(&out.sample)
            + vec_bytes(&out.sample_type)
            + vec_bytes(&self.comments);
        let header = self.header.as_ref().map_or(0, |h| {
            vec_bytes(&h.types)
                + h.types
                    .iter()
                    .map(|(t, u)| t.len() + u.len())
                    .sum::<usize>()
                + h.period_type.as_ref().map_or(0, |(t, u)| t.len() + u.len())
                + h.drop_frames.len()
                + h.keep_frames.len()
                + h.default_sample_type.len()
        });
        (tables + header + self.heap_bytes + self.strings.memory_bytes()) as u64
    }

    /// Makes room for every record of `raw` being new, so that nothing
    /// grows while it is added (what `growth_bound` counts).
    fn reserve_for(&mut self, raw: &pprof::Profile) {
        self.functions.reserve(raw.function.len());
        self.mappings.reserve(raw.mapping.len());
        self.locations.reserve(raw.location.len());
        self.samples.reserve(raw.sample.len());
        self.seen_comments.reserve(raw.comment.len());
        self.out.function.reserve(raw.function.len());
        self.out.mapping.reserve(raw.mapping.len());
        self.out.location.reserve(raw.location.len());
        self.out.sample.reserve(raw.sample.len());
        self.comments.reserve(raw.comment.len());
        // (Sample type names, and at `finish` the header's strings.)
        self.strings.reserve(raw.string_table.len() + 8);
    }

    /// The most adding `profile` can allocate: the tables' growth for
    /// every record new, the new records' own vectors (once in a key,
    /// once in the record), their strings, and the profile's id maps.
    fn growth_bound(&self, profile: &DecodedProfile) -> u64 {
        let raw = &profile.raw;
        let out = &self.out;
        let grow = |len: usize, capacity: usize, incoming: usize, entry: usize| {
            map_growth(len, capacity, incoming, entry)
        };
        let tables = grow(
            self.functions.len(),
            self.functions.capacity(),
            raw.function.len(),
            FUNCTION_ENTRY,
        ) + grow(
            self.mappings.len(),
            self.mappings.capacity(),
            raw.mapping.len(),
            MAPPING_ENTRY,
        ) + grow(
            self.locations.len(),
            self.locations.capacity(),
            raw.location.len(),
            LOCATION_ENTRY,
        ) + grow(
            self.samples.len(),
            self.samples.capacity(),
            raw.sample.len(),
            SAMPLE_ENTRY,
        ) + grow(
            self.seen_comments.len(),
            self.seen_comments.capacity(),
            raw.comment.len(),
            size_of::<String>(),
        ) + vec_growth(&out.function, raw.function.len())
            + vec_growth(&out.mapping, raw.mapping.len())
            + vec_growth(&out.location, raw.location.len())
            + vec_growth(&out.sample, raw.sample.len())
            + vec_growth(&self.comments, raw.comment.len());
        let strings: usize = raw.string_table.iter().map(String::len).sum();
        let types: usize = profile
            .sample_types()
            .iter()
            .map(|(t, u)| t.len() + u.len())
            .sum();
        let strings = self
            .strings
            .growth_bytes(raw.string_table.len() + 8, strings + types);
        let lines: usize = raw.location.iter().map(|l| l.line.len()).sum();
        let mut deepest = 0;
        let samples: usize = raw
            .sample
            .iter()
            .map(|s| {
                let own = block_bytes(s.location_id.len() * size_of::<u64>())
                    + block_bytes(s.label.len() * size_of::<pprof::Label>());
                deepest = deepest.max(own);
                2 * own + block_bytes(s.value.len().max(1) * size_of::<i64>())
            })
            .sum();
        let comments: usize = profile
            .comments()
            .iter()
            .map(|c| 2 * block_bytes(c.len()))
            .sum();
        let records = 2 * (lines * size_of::<pprof::Line>() + raw.location.len() * BLOCK_OVERHEAD)
            + samples
            + comments;
        // Per profile: the id maps, the string index map, the sample types
        // and value map, one sample's key being looked up.
        let scratch = map_growth(0, 0, raw.function.len(), ID_ENTRY)
            + map_growth(0, 0, raw.mapping.len(), ID_ENTRY)
            + map_growth(0, 0, raw.location.len(), ID_ENTRY)
            + raw.string_table.len() * size_of::<i64>()
            + 4 * (types + 64 * raw.sample_type.len() + 64)
            + 2 * deepest;
        (tables + strings + records + scratch) as u64
    }

    /// Adds one profile (of the same sample types as the first, in any
    /// order). Without a budget.
    pub fn add(&mut self, profile: &DecodedProfile) -> Result<(), String> {
        let own = profile.sample_types();
        // Values are matched by name: a name twice cannot be (found in
        // review: both took the other profile's one value, and its second
        // type was dropped).
        if let Some((t, u)) = own
            .iter()
            .enumerate()
            .find_map(|(i, t)| own[..i].contains(t).then_some(t))
        {
            return Err(format!(
                "profile {} has sample type {}/{} twice: its values cannot be matched by name",
                self.added + 1,
                shown(t),
                shown(u)
            ));
        }
        let header = self.header.get_or_insert_with(|| header_of(profile));
        // Values are matched by sample type name: another order is fine,
        // another set of types is not.
        let types = &header.types;
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
                    self.added + 1,
                    describe(&own),
                    describe(types)
                )
            })?;
        if self.added == 0 {
            let strings = &mut self.strings;
            self.out.sample_type = types
                .iter()
                .map(|(t, u)| pprof::ValueType {
                    r#type: strings.intern(t),
                    unit: strings.intern(u),
                })
                .collect();
        }
        let types = types.len();
        self.added += 1;
        let raw = &profile.raw;
        self.reserve_for(raw);
        let mut own_strings = ProfileStrings::new(profile);
        let strings = &mut self.strings;
        let out = &mut self.out;

        let mut function_ids: InputMap<u64, u64> = InputMap::with_capacity(raw.function.len());
        for function in &raw.function {
            let key = (
                own_strings.id(strings, function.name),
                own_strings.id(strings, function.system_name),
                own_strings.id(strings, function.filename),
                function.start_line,
            );
            let next = out.function.len() as u64 + 1;
            let (estimate, encoded) = (&mut self.result_estimate, &mut self.result_encoded);
            let id = *self.functions.entry(key).or_insert_with(|| {
                let function = pprof::Function {
                    id: next,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                };
                *estimate += FUNCTION_ESTIMATE;
                *encoded += field_bytes(function.encoded_len());
                out.function.push(function);
                next
            });
            function_ids.insert(function.id, id);
        }

        let mut mapping_ids: InputMap<u64, u64> = InputMap::with_capacity(raw.mapping.len());
        for mapping in &raw.mapping {
            let key = (
                own_strings.id(strings, mapping.filename),
                own_strings.id(strings, mapping.build_id),
                mapping.memory_start,
                mapping.memory_limit,
                mapping.file_offset,
            );
            let next = out.mapping.len() as u64 + 1;
            let (estimate, encoded) = (&mut self.result_estimate, &mut self.result_encoded);
            let id = *self.mappings.entry(key).or_insert_with(|| {
                let mapping = pprof::Mapping {
                    id: next,
                    memory_start: key.2,
                    memory_limit: key.3,
                    file_offset: key.4,
                    filename: key.0,
                    build_id: key.1,
                    ..*mapping
                };
                *estimate += MAPPING_ESTIMATE;
                *encoded += field_bytes(mapping.encoded_len());
                out.mapping.push(mapping);
                next
            });
            mapping_ids.insert(mapping.id, id);
        }

        let mut location_ids: InputMap<u64, u64> = InputMap::with_capacity(raw.location.len());
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
            let heap_bytes = &mut self.heap_bytes;
            let (estimate, encoded) = (&mut self.result_estimate, &mut self.result_encoded);
            let id = *self.locations.entry(key).or_insert_with_key(|key| {
                *heap_bytes += 2 * block_bytes(key.2.len() * size_of::<pprof::Line>());
                let location = pprof::Location {
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
                };
                *estimate += location_estimate(&location);
                *encoded += field_bytes(location.encoded_len());
                out.location.push(location);
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
                        own_strings.id(strings, l.key),
                        own_strings.id(strings, l.str),
                        l.num,
                        own_strings.id(strings, l.num_unit),
                    )
                })
                .collect();
            labels.sort_unstable();
            let key = (stack, labels);
            let index = match self.samples.get(&key) {
                Some(&index) => index,
                None => {
                    let index = out.sample.len();
                    self.heap_bytes += 2
                        * (block_bytes(key.0.len() * size_of::<u64>())
                            + block_bytes(key.1.len() * size_of::<pprof::Label>()))
                        + block_bytes(types * size_of::<i64>());
                    let sample = pprof::Sample {
                        location_id: key.0.clone(),
                        value: vec![0; types],
                        label: key
                            .1
                            .iter()
                            .map(|&(key, str, num, num_unit)| pprof::Label {
                                key,
                                str,
                                num,
                                num_unit,
                            })
                            .collect(),
                    };
                    self.result_estimate += sample_estimate(&sample);
                    self.result_encoded += field_bytes(sample.encoded_len());
                    out.sample.push(sample);
                    self.samples.insert(key, index);
                    index
                }
            };
            let sums = &mut out.sample[index].value;
            for (sum, from) in sums.iter_mut().zip(&value_map) {
                *sum = sum.saturating_add(sample.value[*from]);
            }
        }

        for comment in profile.comments() {
            // A function's error is its own profile's: the merged rows
            // sum several, and no one's error is theirs.
            if is_function_error_comment(comment) {
                continue;
            }
            if self.seen_comments.insert(comment.to_string()) {
                self.heap_bytes += 2 * block_bytes(comment.len());
                self.comments.push(comment.to_string());
            }
        }
        if raw.time_nanos > 0 {
            let (start, end) = &mut self.span;
            *start = (*start).min(raw.time_nanos);
            *end = (*end).max(raw.time_nanos.saturating_add(raw.duration_nanos.max(0)));
        }
        Ok(())
    }

    /// `add`, within the merger's budget: the most the profile can add is
    /// reserved first, and only what the tables then hold is kept.
    pub fn add_within(&mut self, profile: &DecodedProfile) -> Result<(), ViewError> {
        if let Some(unreadable) = &self.unreadable {
            return Err(ViewError::Memory(unreadable.clone()));
        }
        let bound = self.growth_bound(profile);
        if let Some(reservation) = self.reservation.as_mut() {
            reservation
                .grow(bound)
                .map_err(|refused| ViewError::Memory(format!("merging this profile {refused}")))?;
        }
        let added = self.add(profile).map_err(ViewError::Argument);
        let held = self.memory_bytes();
        if let Some(reservation) = self.reservation.as_mut() {
            reservation.shrink_to(held);
            // Refused as soon as it is known, not after the last profile.
            let limit = reservation.budget().limit();
            let read_back = self.read_back_lower_bound();
            if read_back > limit {
                let message = format!(
                    "the merged profile would take more than {} of memory to read back (limit {}); merge fewer profiles",
                    megabytes(read_back),
                    megabytes(limit)
                );
                self.unreadable = Some(message.clone());
                return Err(ViewError::Memory(message));
            }
        }
        added
    }

    /// At least what reading the result back will reserve.
    fn read_back_lower_bound(&self) -> u64 {
        let strings = self.strings.len() as u64;
        let bytes = self.strings.string_bytes() as u64;
        read_back_bytes(
            self.result_estimate + strings * string_estimate("") + bytes,
            self.result_encoded + 2 * strings + bytes,
        )
    }

    /// The merged profile.
    pub fn finish(mut self) -> Result<pprof::Profile, String> {
        let header = self
            .header
            .take()
            .ok_or_else(|| "merge needs at least one profile".to_string())?;
        self.strings.reserve(self.comments.len() + 8);
        let strings = &mut self.strings;
        let mut out = std::mem::take(&mut self.out);
        let (start, end) = self.span;
        if start != i64::MAX {
            out.time_nanos = start;
            out.duration_nanos = end.saturating_sub(start);
        }
        if let Some((r#type, unit)) = &header.period_type {
            out.period_type = Some(pprof::ValueType {
                r#type: strings.intern(r#type),
                unit: strings.intern(unit),
            });
        }
        out.period = header.period;
        out.drop_frames = strings.intern(&header.drop_frames);
        out.keep_frames = strings.intern(&header.keep_frames);
        out.default_sample_type = strings.intern(&header.default_sample_type);
        let mut comments = std::mem::take(&mut self.comments);
        comments.insert(
            0,
            format!("memprofiler_pprof_rs merge: {} profiles", self.added),
        );
        out.comment = comments.iter().map(|c| strings.intern(c)).collect();
        out.string_table = std::mem::take(&mut self.strings).into_strings();
        Ok(out)
    }

    /// Reserves what `finish` adds to the string table (the comments and
    /// the header's strings), once; on refusal the merger is as it was.
    pub fn reserve_finish(&mut self) -> Result<(), ViewError> {
        if let Some(unreadable) = &self.unreadable {
            return Err(ViewError::Memory(unreadable.clone()));
        }
        if self.finish_reserved {
            return Ok(());
        }
        if let Some(reservation) = self.reservation.as_mut() {
            let bytes = self.comments.iter().map(|c| c.len() + 64).sum::<usize>() + 1024;
            let growth = self.strings.growth_bytes(self.comments.len() + 8, bytes)
                + vec_growth(&self.comments, 1);
            reservation
                .grow(growth as u64)
                .map_err(|refused| ViewError::Memory(format!("finishing the merge {refused}")))?;
        }
        self.finish_reserved = true;
        Ok(())
    }

    /// `finish`, read back as a profile within the merger's budget: the
    /// result keeps only its own estimate. A result that could not be read
    /// back from its file under the same limit is refused: merge never
    /// writes what the readers refuse.
    pub fn finish_within(mut self) -> Result<DecodedProfile, ViewError> {
        self.reserve_finish()?;
        let reservation = self.reservation.take();
        let merged = self.finish().map_err(ViewError::Argument)?;
        let Some(mut reservation) = reservation else {
            return DecodedProfile::from_raw(merged).map_err(|error| {
                ViewError::Argument(format!("the merged profile is invalid: {error}"))
            });
        };
        let budget = reservation.budget();
        let read_back = read_back_estimate(&merged);
        if read_back > budget.limit() {
            return Err(ViewError::Memory(format!(
                "the merged profile would take about {} of memory to read back (limit {}); merge fewer profiles",
                megabytes(read_back),
                megabytes(budget.limit())
            )));
        }
        // Indexing it takes its estimate; the merger's tables are gone.
        let estimate = memory_estimate(&merged);
        if estimate > reservation.bytes() {
            reservation
                .grow(estimate - reservation.bytes())
                .map_err(|refused| {
                    ViewError::Memory(format!("reading the merged profile back {refused}"))
                })?;
        }
        let mut profile = DecodedProfile::from_raw(merged).map_err(|error| {
            ViewError::Argument(format!("the merged profile is invalid: {error}"))
        })?;
        reservation.shrink_to(estimate);
        profile.hold(reservation);
        Ok(profile)
    }
}

fn header_of(profile: &DecodedProfile) -> Header {
    let raw = &profile.raw;
    let string = |index: i64| profile.string(index as u32).to_string();
    Header {
        types: profile.sample_types(),
        period_type: raw
            .period_type
            .as_ref()
            .map(|t| (string(t.r#type), string(t.unit))),
        period: raw.period,
        drop_frames: string(raw.drop_frames),
        keep_frames: string(raw.keep_frames),
        default_sample_type: string(raw.default_sample_type),
    }
}

/// `merge`, read back as a profile, within `budget` (see `Merger`).
pub fn merge_within(
    profiles: &[&DecodedProfile],
    budget: &'static ReadBudget,
) -> Result<DecodedProfile, ViewError> {
    if profiles.is_empty() {
        return Err(ViewError::Argument(
            "merge needs at least one profile".to_string(),
        ));
    }
    let mut merger = Merger::within(budget);
    for profile in profiles {
        merger.add_within(profile)?;
    }
    merger.finish_within()
}

pub fn merge(profiles: &[&DecodedProfile]) -> Result<pprof::Profile, String> {
    let mut merger = Merger::new();
    for profile in profiles {
        merger.add(profile)?;
    }
    merger.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoded_profile::tests::profile_from;

    const TYPES: &[(&str, &str)] = &[("alloc_space", "bytes"), ("inuse_space", "bytes")];

    fn decoded_within(raw: &pprof::Profile, budget: &'static ReadBudget) -> DecodedProfile {
        use prost::Message;
        DecodedProfile::decode_within(&raw.encode_to_vec(), budget).unwrap()
    }

    /// Each profile is reserved for before the merger allocates for it,
    /// and the merger then keeps about what it really holds.
    #[test]
    fn a_merger_reserves_before_it_allocates_and_keeps_what_it_holds() {
        use test_support::counting_alloc::{held_bytes, peak_bytes_during};
        let samples: Vec<(String, i64)> = (0..2_000).map(|k| (format!("M#m{k}"), k)).collect();
        let raw = |shift: i64| {
            let stacks: Vec<[(&str, &str, i64); 1]> = samples
                .iter()
                .map(|(name, line)| [(name.as_str(), "m.rb", line + shift)])
                .collect();
            let list: Vec<crate::decoded_profile::tests::TestSample> = stacks
                .iter()
                .map(|stack| (&stack[..], &[1i64, 1][..], None))
                .collect();
            profile_from(TYPES, &list)
        };
        let budget = crate::read_budget::test_budget(1 << 30);
        // The last two repeat the first two: nothing new to hold.
        let inputs: Vec<DecodedProfile> = (0..6)
            .map(|k| decoded_within(&raw(k % 4), budget))
            .collect();
        let inputs_held = budget.held();
        let start = held_bytes();
        let mut merger = Merger::within(budget);
        for (k, input) in inputs.iter().enumerate() {
            let bound = merger.growth_bound(input);
            let (added, peak) = peak_bytes_during(|| merger.add_within(input));
            added.unwrap();
            assert!(
                peak as u64 <= bound,
                "profile {k}: {peak} bytes allocated, {bound} reserved"
            );
            let really = (held_bytes() - start) as u64;
            let counted = merger.memory_bytes();
            assert!(
                really <= counted && counted <= 2 * really + 4096,
                "profile {k}: holds {really}, counts {counted}"
            );
            assert_eq!(
                budget.held(),
                inputs_held + counted,
                "profile {k}: keeps what it counts"
            );
        }
        let (merged, peak) = peak_bytes_during(|| merger.finish_within().unwrap());
        let estimate = memory_estimate(&merged.raw);
        assert!(
            peak as u64 <= estimate,
            "finishing: {peak} bytes allocated, {estimate} reserved"
        );
        assert_eq!(merged.sample_count(), 8_000);
        assert_eq!(
            merged.comments()[0],
            "memprofiler_pprof_rs merge: 6 profiles"
        );
        assert_eq!(merged.reserved_bytes(), estimate);
        assert_eq!(budget.held(), inputs_held + estimate);
        drop(merged);
        assert_eq!(budget.held(), inputs_held);
    }

    /// The CLI's way: each file read, added and let go, so the merge of
    /// many files holds one of them at a time, and takes their total time.
    #[test]
    fn a_merger_holds_only_its_result_between_profiles() {
        let budget = crate::read_budget::test_budget(64 << 20);
        let mut merger = Merger::within(budget);
        for k in 0..200i64 {
            let name = format!("W{k}#work");
            let input = decoded_within(
                &profile_from(
                    TYPES,
                    &[(
                        &[(name.as_str(), "w.rb", k), ("Shared#run", "s.rb", 1)],
                        &[1, 2],
                        None,
                    )],
                ),
                budget,
            );
            merger.add_within(&input).unwrap();
            drop(input);
            assert_eq!(budget.held(), merger.memory_bytes());
        }
        let merged = merger.finish_within().unwrap();
        assert_eq!(merged.sample_count(), 200);
        assert_eq!(merged.raw.function.len(), 201, "Shared#run once");
    }

    #[test]
    fn merging_past_the_limit_or_into_an_unreadable_file_is_refused() {
        // Three profiles of one long distinct name each, read one at a time
        // and let go once added (as the CLI does): the merger holds each
        // name twice (the string table and its index), reading the merged
        // file back takes three times its bytes.
        let raws: Vec<pprof::Profile> = (0..3)
            .map(|k| {
                let big = format!("B{k}#") + &"b".repeat(3 << 19);
                profile_from(TYPES, &[(&[(big.as_str(), "b.rb", 1)], &[1, 1], None)])
            })
            .collect();
        let merge_one_by_one = |budget: &'static ReadBudget| {
            let mut merger = Merger::within(budget);
            for raw in &raws {
                merger.add_within(&decoded_within(raw, budget))?;
            }
            merger.finish_within()
        };
        let budget = crate::read_budget::test_budget(12 << 20);
        let error = merge_one_by_one(budget).err().unwrap();
        let ViewError::Memory(message) = error else {
            panic!("{error:?}")
        };
        assert!(
            message.starts_with("the merged profile would take more than")
                && message.ends_with("to read back (limit 12.0 MB); merge fewer profiles"),
            "{message}"
        );
        assert_eq!(budget.held(), 0, "a refusal keeps nothing");
        // Refused at the third profile, not at the end; and for good.
        let mut merger = Merger::within(budget);
        for raw in &raws[..2] {
            merger.add_within(&decoded_within(raw, budget)).unwrap();
        }
        let third = decoded_within(&raws[2], budget);
        assert!(merger.add_within(&third).is_err());
        let held = budget.held();
        let again = merger.add_within(&third).err().unwrap();
        assert!(
            matches!(&again, ViewError::Memory(m) if *m == message),
            "{again:?}"
        );
        assert_eq!((budget.held(), merger.len()), (held, 3), "not added twice");
        assert!(merger.finish_within().is_err());
        drop(third);
        assert_eq!(budget.held(), 0);
        // Room to read one, not to merge it too.
        budget.set_limit(4 << 20);
        let error = merge_one_by_one(budget).err().unwrap();
        assert!(
            matches!(&error, ViewError::Memory(m) if m.starts_with("merging this profile would take")),
            "{error:?}"
        );
        assert_eq!(budget.held(), 0);
        budget.set_limit(16 << 20);
        assert_eq!(merge_one_by_one(budget).unwrap().sample_count(), 3);
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

    /// A function's error describes its own profile's row: merged rows sum
    /// several, so merging drops them (and keeps other comments).
    #[test]
    fn merging_drops_the_functions_errors() {
        let with_comments = |comments: &[&str]| {
            let mut raw = profile_from(TYPES, &[(&[("A#x", "a.rb", 1)], &[10, 1], None)]);
            for comment in comments {
                raw.string_table.push(comment.to_string());
                raw.comment.push(raw.string_table.len() as i64 - 1);
            }
            DecodedProfile::from_raw(raw).unwrap()
        };
        let line = "relative standard error of a function, flat and cum (%): alloc_objects - - alloc_space 5.0 5.0 inuse_objects - - inuse_space 9.0 9.0 in A#x";
        let a = with_comments(&[line, "process: a"]);
        let b = with_comments(&["relative standard error of a function: not worked out (more than 100000 distinct stacks)"]);
        let merged = DecodedProfile::from_raw(merge(&[&a, &b]).unwrap()).unwrap();
        assert_eq!(
            merged.comments(),
            ["memprofiler_pprof_rs merge: 2 profiles", "process: a"]
        );
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
    fn a_sample_type_named_twice_is_refused() {
        let twice = DecodedProfile::from_raw(profile_from(
            &[("x", "count"), ("x", "count")],
            &[(&[("f", "", 0)], &[1, 2], None)],
        ))
        .unwrap();
        let other = DecodedProfile::from_raw(profile_from(
            &[("x", "count"), ("y", "count")],
            &[(&[("f", "", 0)], &[10, 20], None)],
        ))
        .unwrap();
        for list in [[&twice, &other], [&other, &twice]] {
            let error = merge(&list).unwrap_err();
            assert!(error.contains("has sample type x/count twice"), "{error}");
        }
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
