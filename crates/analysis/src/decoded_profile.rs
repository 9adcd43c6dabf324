//! A pprof profile read back from bytes: gzipped or not, from this gem or
//! from any other tool. Decoding checks every cross-reference once, so the
//! views (top, diff, flame graph, merge) can index without re-checking, and
//! a bad file gets one clear sentence instead of a panic.

use std::fmt;
use std::io::Read;

use flate2::bufread::GzDecoder;
use prost::Message;

use super::display::{shown, shown_at_most};
use super::memory_estimate::{decode_memory_estimate, HoldsGroups, DECOMPRESS_CHUNK};
use super::read_budget::{OverBudget, ReadBudget, Reservation, READ_BUDGET};
use crate::{InputMap, InputSet};
use pprof::gzip::gzip_to;

/// Decompressed profiles larger than this are refused: a gzip bomb must not
/// take the machine's memory (the biggest real heap profiles are ~100 MB).
pub const MAX_DECODED_BYTES: u64 = 1 << 30;

/// A sample's stack, its locations' inlined frames counted, is refused past
/// this depth (views hold one stack at a time, 4 bytes a frame). Real
/// stacks are at most a few thousand frames deep (this gem cuts them at
/// 1,024); a crafted one can list a location of 100,000 inlined lines
/// 10,000 times in a file of 1 KB.
pub const MAX_STACK_DEPTH: u64 = 1_000_000;

/// Every view walks each sample's stack, so the sum of the stacks' depths
/// bounds their time: profiles past it are refused. A 10 MB profile of this
/// gem holds about 3.4 million frames in all.
pub const MAX_EXPANDED_FRAMES: u64 = 50_000_000;

/// Characters of a binary's name kept in the names of its unsymbolized
/// locations ("libfoo.so 0x1234"), one name per location.
const MAX_BINARY_NAME_CHARS: usize = 64;

/// Sample types a profile may declare, and the length of their names: real
/// profiles have a few ("alloc_space"...), and every view copies them.
const MAX_SAMPLE_TYPES: usize = 64;
const MAX_SAMPLE_TYPE_BYTES: usize = 256;

/// Label keys that name the allocated object's class, in the order tried:
/// this gem's, then Datadog's and other Ruby profilers'.
const CLASS_LABEL_KEYS: [&str; 3] = ["class", "allocation class", "object type"];

/// Why bytes could not be read as a profile. The message is for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Empty,
    TruncatedGzip,
    BadGzip(String),
    TooLarge,
    /// Decoding needs more memory than the encoded bytes (an empty label is
    /// 2 bytes on the wire and 32 in memory, a packed varint 1 and 8): the
    /// estimate (`decode_memory_estimate`) is reserved from the read budget
    /// before decoding, and a profile it refuses is not read.
    OverBudget(OverBudget),
    TrailingData,
    NotPprof(String),
    Malformed(String),
    /// Stacks deeper, or more frames in all, than the views can walk in
    /// bounded time (see MAX_STACK_DEPTH, MAX_EXPANDED_FRAMES).
    TooComplex(String),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Empty => write!(f, "the file is empty"),
            ReadError::TruncatedGzip => write!(
                f,
                "truncated gzip data: the file ends before its compressed stream does (was it copied while still being written?)"
            ),
            ReadError::BadGzip(why) => write!(f, "corrupt gzip data ({why})"),
            ReadError::TooLarge => write!(
                f,
                "the profile decompresses to more than {} MB; refusing to read it",
                MAX_DECODED_BYTES >> 20
            ),
            ReadError::OverBudget(refused) => {
                write!(f, "reading this profile {refused}; refusing to read it")
            }
            ReadError::TrailingData => write!(
                f,
                "unexpected data after the end of the gzip stream (two profiles written into one file?)"
            ),
            ReadError::NotPprof(why) => write!(f, "not a pprof profile ({why})"),
            ReadError::Malformed(why) => write!(f, "malformed pprof profile: {why}"),
            ReadError::TooComplex(why) => write!(f, "{why}; refusing to read it"),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<OverBudget> for ReadError {
    fn from(refused: OverBudget) -> Self {
        ReadError::OverBudget(refused)
    }
}

/// One frame of a stack, resolved. Strings are `DecodedProfile::string`
/// indices; `start_line` is 0 for C methods and unknown starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameInfo {
    pub name: u32,
    pub file: u32,
    pub line: i64,
    pub start_line: i64,
}

pub struct DecodedProfile {
    /// The message as decoded; re-encoded by `to_pprof` and `merge`.
    pub raw: pprof::Profile,
    /// Names for locations without symbols ("libfoo.so 0x1234"), indexed
    /// after the string table (see `string`).
    extra_strings: Vec<String>,
    /// Every distinct frame; `location_frames` and stacks index into it.
    pub frames: Vec<FrameInfo>,
    /// Per location (by position in `raw.location`): its frames, innermost
    /// first (a location holds several when functions were inlined).
    pub location_frames: Vec<Vec<u32>>,
    /// Per sample: its locations (positions in `raw.location`), leaf first.
    pub sample_locations: Vec<Vec<u32>>,
    /// Per sample: the string index of its class label, if it has one.
    pub sample_class: Vec<Option<u32>>,
    /// Per sample: its stack's depth, inlined frames counted.
    pub sample_depth: Vec<u32>,
    /// Per string index: the index of its first occurrence.
    canonical: Vec<u32>,
    /// Position in `raw.mapping` of each location's mapping, if any.
    pub location_mapping: Vec<Option<u32>>,
    /// This profile's share of the read budget (none for profiles built
    /// in tests), returned when it is freed.
    reservation: Option<Reservation>,
}

impl DecodedProfile {
    /// The keys of the samples' string labels, sorted ("none" if none;
    /// the first 20 and how many more, for a message).
    pub fn label_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .raw
            .sample
            .iter()
            .flat_map(|sample| sample.label.iter())
            .filter(|label| label.str != 0)
            .map(|label| shown(self.string(self.canonical[label.key as usize])).into_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if keys.is_empty() {
            keys.push("none".into());
        }
        if keys.len() > 20 {
            let more = keys.len() - 20;
            keys.truncate(20);
            keys.push(format!("and {more} more"));
        }
        keys
    }

    /// Why no sample has a string label `key`, for a message: it holds
    /// numbers (gc_age), or no sample has it.
    pub fn missing_label(&self, key: &str) -> String {
        let key_index = self.canonical_index_of(key);
        let numeric = self
            .raw
            .sample
            .iter()
            .flat_map(|s| s.label.iter())
            .any(|l| l.str == 0 && Some(self.canonical[l.key as usize]) == key_index);
        if numeric {
            format!(
                "label {key:?} holds numbers; --by groups by a label's string values (the profile's: {})",
                self.label_keys().join(", ")
            )
        } else {
            format!(
                "no sample has a label {key:?} (the profile's labels: {})",
                self.label_keys().join(", ")
            )
        }
    }

    /// Per sample: the string index of its label `key`'s value (the first
    /// with a string value), if it has one.
    pub fn sample_label_values(&self, key: &str) -> Vec<Option<u32>> {
        // One comparison per label, by canonical index: a crafted string
        // table can repeat the key any number of times.
        let key = self.canonical_index_of(key);
        self.raw
            .sample
            .iter()
            .map(|sample| {
                sample
                    .label
                    .iter()
                    .find(|l| l.str != 0 && Some(self.canonical[l.key as usize]) == key)
                    .map(|l| self.canonical[l.str as usize])
            })
            .collect()
    }

    /// The canonical index of string `text`, if the table has it.
    fn canonical_index_of(&self, text: &str) -> Option<u32> {
        let index = self.raw.string_table.iter().position(|s| s == text)?;
        Some(self.canonical[index])
    }

    /// Reads a profile from a file's bytes (gzipped or plain protobuf),
    /// within the process's read budget.
    pub fn decode(bytes: &[u8]) -> Result<DecodedProfile, ReadError> {
        DecodedProfile::decode_within(bytes, &READ_BUDGET)
    }

    /// Reads a profile, reserving from `budget` before allocating: the
    /// decompressed bytes as they grow, then the decoded profile's estimate
    /// (kept until the profile is freed).
    pub fn decode_within(
        bytes: &[u8],
        budget: &'static ReadBudget,
    ) -> Result<DecodedProfile, ReadError> {
        DecodedProfile::decode_reserved(bytes, budget.reserve(0)?)
    }

    /// As `decode_within`, `reservation` already paying for what the
    /// caller holds while this runs (a copy of `bytes`, say): a refusal
    /// then names the whole cost.
    pub fn decode_reserved(
        bytes: &[u8],
        mut reservation: Reservation,
    ) -> Result<DecodedProfile, ReadError> {
        let plain = decompress_within(bytes, &mut reservation)?;
        let needed = decode_memory_estimate(&plain).map_err(|HoldsGroups| {
            ReadError::NotPprof("it holds protobuf groups, which pprof never uses".to_string())
        })?;
        reservation.grow(needed)?;
        let raw = pprof::Profile::decode(&plain[..])
            .map_err(|error| ReadError::NotPprof(format!("protobuf decoding failed: {error}")))?;
        drop(plain);
        reservation.shrink_to(needed);
        let mut profile = DecodedProfile::from_raw(raw)?;
        profile.reservation = Some(reservation);
        Ok(profile)
    }

    /// Gives the profile a reservation that now pays for it (a merged
    /// profile's, see `memory_estimate`).
    pub fn hold(&mut self, reservation: Reservation) {
        self.reservation = Some(reservation);
    }

    /// The read budget's bytes this profile holds.
    pub fn reserved_bytes(&self) -> u64 {
        self.reservation.as_ref().map_or(0, Reservation::bytes)
    }

    fn budget(&self) -> &'static ReadBudget {
        self.reservation
            .as_ref()
            .map_or(&READ_BUDGET, Reservation::budget)
    }

    /// Checks and indexes an already decoded message.
    pub fn from_raw(raw: pprof::Profile) -> Result<DecodedProfile, ReadError> {
        check_shape(&raw)?;
        let strings = raw.string_table.len();
        let string_index = |index: i64, what: &dyn Fn() -> String| -> Result<u32, ReadError> {
            if index >= 0 && (index as usize) < strings {
                Ok(index as u32)
            } else {
                Err(ReadError::Malformed(format!(
                    "{} refers to string {index}, but the string table has {strings} entries",
                    what()
                )))
            }
        };

        // Frames and class labels use each string's first index: a table
        // may repeat a string, and a view that compares indexes must see one.
        let canonical = canonical_strings(&raw.string_table);

        let mut mapping_by_id = IdIndex::for_count(raw.mapping.len());
        for (position, mapping) in raw.mapping.iter().enumerate() {
            string_index(mapping.filename, &|| format!("mapping {}", mapping.id))?;
            string_index(mapping.build_id, &|| format!("mapping {}", mapping.id))?;
            mapping_by_id.insert(mapping.id, position as u32);
        }

        let mut function_by_id = IdIndex::for_count(raw.function.len());
        for (position, function) in raw.function.iter().enumerate() {
            let what = || format!("function {}", function.id);
            string_index(function.name, &what)?;
            string_index(function.system_name, &what)?;
            string_index(function.filename, &what)?;
            if !function_by_id.insert(function.id, position as u32) {
                return Err(ReadError::Malformed(format!(
                    "two functions have id {}",
                    function.id
                )));
            }
        }

        let mut extra_strings: Vec<String> = Vec::new();
        let mut binary_names: Vec<Option<String>> = vec![None; raw.mapping.len()];
        let mut frame_ids: InputMap<FrameInfo, u32> = InputMap::default();
        let mut frames = Vec::new();
        let mut intern_frame = |frame: FrameInfo| -> u32 {
            *frame_ids.entry(frame).or_insert_with(|| {
                frames.push(frame);
                (frames.len() - 1) as u32
            })
        };

        let mut location_by_id = IdIndex::for_count(raw.location.len());
        let mut location_frames = Vec::with_capacity(raw.location.len());
        let mut location_mapping = Vec::with_capacity(raw.location.len());
        for (position, location) in raw.location.iter().enumerate() {
            if !location_by_id.insert(location.id, position as u32) {
                return Err(ReadError::Malformed(format!(
                    "two locations have id {}",
                    location.id
                )));
            }
            let mapping = if location.mapping_id == 0 {
                None
            } else {
                Some(mapping_by_id.get(location.mapping_id).ok_or_else(|| {
                    ReadError::Malformed(format!(
                        "location {} refers to mapping {}, which does not exist",
                        location.id, location.mapping_id
                    ))
                })?)
            };
            location_mapping.push(mapping);
            let mut own = Vec::with_capacity(location.line.len().max(1));
            for line in &location.line {
                let function = function_by_id.get(line.function_id).ok_or_else(|| {
                    ReadError::Malformed(format!(
                        "location {} refers to function {}, which does not exist",
                        location.id, line.function_id
                    ))
                })?;
                let function = &raw.function[function as usize];
                own.push(intern_frame(FrameInfo {
                    name: canonical[function.name as usize],
                    file: canonical[function.filename as usize],
                    line: line.line,
                    start_line: function.start_line,
                }));
            }
            if own.is_empty() {
                // No symbols (a native profile without symbolization): the
                // address, and the binary it is in, are all there is. The
                // binary's name is cut once per mapping: it is copied into
                // each of its locations' names.
                let binary = match mapping {
                    Some(m) => binary_names[m as usize]
                        .get_or_insert_with(|| {
                            let path = &raw.string_table[raw.mapping[m as usize].filename as usize];
                            let base = path.rsplit('/').next().unwrap_or(path);
                            shown_at_most(base, MAX_BINARY_NAME_CHARS).into_owned()
                        })
                        .as_str(),
                    None => "",
                };
                let name = if binary.is_empty() {
                    format!("0x{:x}", location.address)
                } else {
                    format!("{binary} 0x{:x}", location.address)
                };
                extra_strings.push(name);
                own.push(intern_frame(FrameInfo {
                    name: (strings + extra_strings.len() - 1) as u32,
                    file: 0,
                    line: 0,
                    start_line: 0,
                }));
            }
            location_frames.push(own);
        }

        // Every index of such a key: a string table may repeat a string.
        let class_keys: Vec<i64> = raw
            .string_table
            .iter()
            .enumerate()
            .filter(|(_, s)| CLASS_LABEL_KEYS.contains(&s.as_str()))
            .map(|(index, _)| index as i64)
            .collect();
        let value_count = raw.sample_type.len();
        let mut sample_locations = Vec::with_capacity(raw.sample.len());
        let mut sample_class = Vec::with_capacity(raw.sample.len());
        let mut sample_depth = Vec::with_capacity(raw.sample.len());
        let mut expanded_frames = 0u64;
        for (position, sample) in raw.sample.iter().enumerate() {
            if sample.value.len() != value_count {
                return Err(ReadError::Malformed(format!(
                    "sample {position} has {} values for {value_count} sample types",
                    sample.value.len()
                )));
            }
            let mut stack = Vec::with_capacity(sample.location_id.len());
            let mut depth = 0u64;
            for id in &sample.location_id {
                let location = location_by_id.get(*id).ok_or_else(|| {
                    ReadError::Malformed(format!(
                        "sample {position} refers to location {id}, which does not exist"
                    ))
                })?;
                depth += location_frames[location as usize].len() as u64;
                stack.push(location);
            }
            if depth > MAX_STACK_DEPTH {
                return Err(ReadError::TooComplex(format!(
                    "sample {position} has a stack of {depth} frames (inlined frames counted; at most {MAX_STACK_DEPTH})"
                )));
            }
            expanded_frames += depth;
            if expanded_frames > MAX_EXPANDED_FRAMES {
                return Err(ReadError::TooComplex(format!(
                    "its stacks hold more than {MAX_EXPANDED_FRAMES} frames in all (inlined frames counted)"
                )));
            }
            sample_locations.push(stack);
            sample_depth.push(depth as u32);
            let mut class = None;
            for label in &sample.label {
                let what = || format!("a label of sample {position}");
                string_index(label.key, &what)?;
                string_index(label.str, &what)?;
                string_index(label.num_unit, &what)?;
                if label.str != 0 && class.is_none() && class_keys.contains(&label.key) {
                    class = Some(canonical[label.str as usize]);
                }
            }
            sample_class.push(class);
        }

        for index in &raw.comment {
            string_index(*index, &|| "a comment".to_string())?;
        }
        string_index(raw.drop_frames, &|| "drop_frames".to_string())?;
        string_index(raw.keep_frames, &|| "keep_frames".to_string())?;
        string_index(raw.default_sample_type, &|| {
            "default_sample_type".to_string()
        })?;
        if let Some(period_type) = &raw.period_type {
            string_index(period_type.r#type, &|| "period_type".to_string())?;
            string_index(period_type.unit, &|| "period_type".to_string())?;
        }

        Ok(DecodedProfile {
            raw,
            extra_strings,
            frames,
            location_frames,
            sample_locations,
            sample_class,
            sample_depth,
            location_mapping,
            canonical,
            reservation: None,
        })
    }

    /// A string by index: the string table, then names made for locations
    /// without symbols.
    pub fn string(&self, index: u32) -> &str {
        let index = index as usize;
        match self.raw.string_table.get(index) {
            Some(s) => s,
            // Indexes are checked when decoding; "" rather than a panic if
            // one ever slips through.
            None => self
                .extra_strings
                .get(index - self.raw.string_table.len())
                .map_or("", String::as_str),
        }
    }

    /// (type, unit) of each sample type, in value order.
    pub fn sample_types(&self) -> Vec<(String, String)> {
        self.raw
            .sample_type
            .iter()
            .map(|t| {
                (
                    self.string(t.r#type as u32).to_string(),
                    self.string(t.unit as u32).to_string(),
                )
            })
            .collect()
    }

    /// Position of the sample type named `name`; `None` picks the profile's
    /// default (or, as `go tool pprof` does, the last one).
    pub fn sample_index(&self, name: Option<&str>) -> Result<usize, String> {
        let types = self.sample_types();
        let wanted = match name {
            Some(name) => name.to_string(),
            // The default, or the last type as `go tool pprof` does (also
            // when the default names a type the profile does not have).
            None => {
                let default = self.string(self.raw.default_sample_type as u32);
                return Ok(types
                    .iter()
                    .position(|(t, _)| t == default)
                    .unwrap_or(types.len() - 1));
            }
        };
        types.iter().position(|(t, _)| *t == wanted).ok_or_else(|| {
            let names: Vec<String> = types.iter().map(|(t, _)| shown(t).into_owned()).collect();
            format!(
                "this profile has no sample type {:?}; it has {}",
                shown(&wanted),
                names.join(", ")
            )
        })
    }

    /// The frames of sample `sample`, leaf first.
    pub fn stack(&self, sample: usize) -> impl Iterator<Item = &FrameInfo> + '_ {
        self.sample_locations[sample]
            .iter()
            .flat_map(move |location| {
                self.location_frames[*location as usize]
                    .iter()
                    .map(move |frame| &self.frames[*frame as usize])
            })
    }

    /// Sum of value `index` over all samples (saturating: crafted values
    /// near i64::MAX must not wrap into negative totals).
    pub fn total(&self, index: usize) -> i64 {
        self.values(index).fold(0i64, i64::saturating_add)
    }

    /// Value `index` of every sample.
    pub fn values(&self, index: usize) -> impl Iterator<Item = i64> + '_ {
        self.raw.sample.iter().map(move |s| s.value[index])
    }

    /// Approximate heap bytes held (for ObjectSpace.memsize_of).
    pub fn memory_bytes(&self) -> usize {
        let strings: usize = self.raw.string_table.iter().map(|s| s.len() + 24).sum();
        let samples: usize = self
            .raw
            .sample
            .iter()
            .map(|s| 80 + s.location_id.len() * 12 + s.value.len() * 8 + s.label.len() * 32)
            .sum();
        strings
            + samples
            + self.raw.location.len() * 96
            + self.raw.function.len() * 40
            + self.frames.len() * 24
            + self
                .extra_strings
                .iter()
                .map(|s| s.len() + 24)
                .sum::<usize>()
    }

    /// How much of each kind the profile holds, for readers that build
    /// objects of their own from its bytes (the Ruby PprofReader estimates
    /// its memory from these), in `SHAPE_KEYS` order.
    pub fn shape(&self) -> [u64; 11] {
        let raw = &self.raw;
        let sum = |n: usize| n as u64;
        [
            sum(raw.sample.len()),
            raw.sample
                .iter()
                .map(|s| sum(s.location_id.len() + s.value.len()))
                .sum(),
            raw.sample.iter().map(|s| sum(s.label.len())).sum(),
            sum(raw.location.len()),
            raw.location.iter().map(|l| sum(l.line.len())).sum(),
            sum(raw.function.len()),
            sum(raw.string_table.len()),
            raw.string_table.iter().map(|s| sum(s.len())).sum(),
            self.sample_depth.iter().map(|d| u64::from(*d)).sum(),
            sum(raw.comment.len()),
            self.reserved_bytes(),
        ]
    }

    pub fn sample_count(&self) -> usize {
        self.raw.sample.len()
    }

    /// The profile's comments, each string once (a comment list can name
    /// one long string any number of times), in order.
    pub fn comments(&self) -> Vec<&str> {
        let mut seen = InputSet::default();
        self.raw
            .comment
            .iter()
            .map(|i| self.canonical[*i as usize])
            .filter(|i| seen.insert(*i))
            .map(|i| self.string(i))
            .collect()
    }

    /// The profile encoded again (gzipped), with another default sample
    /// type if one is given (e.g. "alloc_space" for /debug/pprof/allocs).
    /// The encoding and its gzip are reserved from the budget while they
    /// are made; the profile itself is not copied.
    pub fn to_pprof(&self, default_sample_type: Option<&str>) -> Result<Written, ViewError> {
        let default = match default_sample_type {
            Some(name) => {
                let index = self.sample_index(Some(name)).map_err(ViewError::Argument)?;
                Some(self.raw.sample_type[index].r#type)
            }
            None => None,
        };
        // The encoding, then its gzip as it grows, then the caller's copy
        // of that (held by the returned reservation).
        let memory = |refused| ViewError::Memory(format!("writing this profile {refused}"));
        let length = self.raw.encoded_len() + 16;
        let mut transient = self.budget().reserve(length as u64).map_err(memory)?;
        let mut plain = Vec::with_capacity(length);
        self.raw
            .encode(&mut plain)
            .expect("a Vec with room for the encoding");
        if let Some(index) = default {
            // A scalar field given twice takes its last value: appending
            // field 14 overrides the default sample type without a copy.
            prost::encoding::int64::encode(14, &index, &mut plain);
        }
        let refused = std::cell::Cell::new(None);
        let out = BudgetedBuffer {
            bytes: Vec::new(),
            reservation: transient.budget().reserve(0).map_err(memory)?,
            refused: &refused,
        };
        let out = match gzip_to(&plain, out) {
            Ok(out) => out,
            Err(_) => {
                // Writing into a Vec fails only when the budget refuses.
                return Err(memory(refused.get().expect("refused by the budget")));
            }
        };
        drop(plain);
        let BudgetedBuffer {
            mut bytes,
            mut reservation,
            ..
        } = out;
        transient.shrink_to(0);
        // The buffer grew by doubling: its slack goes, and the reservation
        // with it, before the caller's copy is reserved.
        bytes.shrink_to_fit();
        reservation.shrink_to(bytes.capacity() as u64);
        reservation.grow(bytes.len() as u64).map_err(memory)?;
        Ok(Written {
            bytes,
            _copy: reservation,
        })
    }
}

/// A profile written out, and the budget held for the caller's copy of it
/// until this is dropped.
pub struct Written {
    pub bytes: Vec<u8>,
    _copy: Reservation,
}

/// A buffer that reserves from the read budget before it grows, and fails
/// the write (noting why in `refused`) when the budget refuses.
struct BudgetedBuffer<'r> {
    bytes: Vec<u8>,
    reservation: Reservation,
    refused: &'r std::cell::Cell<Option<OverBudget>>,
}

impl std::io::Write for BudgetedBuffer<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let length = self.bytes.len() + data.len();
        if length > self.bytes.capacity() {
            let capacity = (self.bytes.capacity() * 2).max(length).max(4096);
            if let Err(refused) = self
                .reservation
                .grow((capacity - self.bytes.capacity()) as u64)
            {
                self.refused.set(Some(refused));
                return Err(std::io::Error::other("over the read budget"));
            }
            self.bytes.reserve_exact(capacity - self.bytes.len());
        }
        self.bytes.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `DecodedProfile::shape` counts.
pub const SHAPE_KEYS: [&str; 11] = [
    "samples",
    "sample_numbers",
    "labels",
    "locations",
    "lines",
    "functions",
    "strings",
    "string_bytes",
    "frames",
    "comments",
    "reserved_bytes",
];

/// Why a view of a profile could not be made: a bad argument, or the read
/// budget (the message names what and how much).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewError {
    Argument(String),
    Memory(String),
}

/// Positions of a profile's mappings, functions or locations by id.
/// Profilers number them 1, 2, 3...: such ids are looked up in an array (a
/// sample's every location is looked up, so this is the parse's inner
/// loop); ids past twice the count go through a randomly keyed map.
struct IdIndex {
    dense: Vec<u32>,
    sparse: InputMap<u64, u32>,
}

impl IdIndex {
    const NONE: u32 = u32::MAX;

    fn for_count(count: usize) -> Self {
        IdIndex {
            dense: vec![Self::NONE; 2 * count + 16],
            sparse: InputMap::default(),
        }
    }

    /// False if `id` was already taken.
    fn insert(&mut self, id: u64, position: u32) -> bool {
        match usize::try_from(id)
            .ok()
            .and_then(|id| self.dense.get_mut(id))
        {
            Some(slot) if *slot == Self::NONE => {
                *slot = position;
                true
            }
            Some(_) => false,
            None => self.sparse.insert(id, position).is_none(),
        }
    }

    fn get(&self, id: u64) -> Option<u32> {
        match usize::try_from(id).ok().and_then(|id| self.dense.get(id)) {
            Some(&slot) => (slot != Self::NONE).then_some(slot),
            None => self.sparse.get(&id).copied(),
        }
    }
}

/// For each string of `table`, the index of its first occurrence.
fn canonical_strings(table: &[String]) -> Vec<u32> {
    let mut first: InputMap<&str, u32> = InputMap::default();
    table
        .iter()
        .enumerate()
        .map(|(index, s)| *first.entry(s.as_str()).or_insert(index as u32))
        .collect()
}

/// Gunzips if the bytes are gzip (else returns them as they are), with the
/// size bound and clear errors; `reservation` grows with the output before
/// the output does.
pub fn decompress_within<'b>(
    bytes: &'b [u8],
    reservation: &mut Reservation,
) -> Result<std::borrow::Cow<'b, [u8]>, ReadError> {
    if bytes.is_empty() {
        return Err(ReadError::Empty);
    }
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        if bytes.len() as u64 > MAX_DECODED_BYTES {
            return Err(ReadError::TooLarge);
        }
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    const CHUNK: usize = DECOMPRESS_CHUNK;
    // Refused part way, the gunzip would have needed more still.
    let part_way = |refused: OverBudget| OverBudget {
        at_least: true,
        ..refused
    };
    let mut decoder = GzDecoder::new(bytes);
    let mut chunk = vec![0u8; CHUNK];
    let mut plain: Vec<u8> = Vec::new();
    reservation.grow(CHUNK as u64).map_err(part_way)?;
    // gzip's trailer gives the size (mod 4 GB): the buffer is made that
    // big at once, not grown by doubling to up to twice it, when it is a
    // size profiles compress to (a crafted one only costs its reservation).
    if let Some(trailer) = bytes.len().checked_sub(4).map(|start| &bytes[start..]) {
        let size = u32::from_le_bytes(trailer.try_into().expect("4 bytes")) as usize;
        let likely = size
            .min(MAX_DECODED_BYTES as usize)
            .min(bytes.len().saturating_mul(64));
        if likely > CHUNK {
            reservation.grow(likely as u64).map_err(part_way)?;
            plain.reserve_exact(likely);
        }
    }
    loop {
        let read = match decoder.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::TruncatedGzip)
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(ReadError::BadGzip(error.to_string())),
        };
        let length = plain.len() + read;
        if length as u64 > MAX_DECODED_BYTES {
            return Err(ReadError::TooLarge);
        }
        if length > plain.capacity() {
            let capacity = (plain.capacity() * 2)
                .max(length)
                .max(CHUNK)
                .min(MAX_DECODED_BYTES as usize);
            reservation
                .grow((capacity - plain.capacity()) as u64)
                .map_err(part_way)?;
            plain.reserve_exact(capacity - plain.len());
        }
        plain.extend_from_slice(&chunk[..read]);
    }
    // GzDecoder stops at the end of the first member; anything after it is
    // a second file appended or garbage.
    let rest = decoder.into_inner();
    if !rest.is_empty() {
        return Err(ReadError::TrailingData);
    }
    Ok(std::borrow::Cow::Owned(plain))
}

/// The checks that tell "some other file" from "a pprof with a bug".
fn check_shape(raw: &pprof::Profile) -> Result<(), ReadError> {
    if raw.string_table.first().map(String::as_str) != Some("") {
        return Err(ReadError::NotPprof(
            "its string table does not start with the empty string".to_string(),
        ));
    }
    if raw.sample_type.is_empty() {
        return Err(ReadError::NotPprof(
            "it declares no sample types".to_string(),
        ));
    }
    if raw.sample_type.len() > MAX_SAMPLE_TYPES {
        return Err(ReadError::Malformed(format!(
            "it declares {} sample types (at most {MAX_SAMPLE_TYPES})",
            raw.sample_type.len()
        )));
    }
    for (position, value_type) in raw.sample_type.iter().enumerate() {
        for index in [value_type.r#type, value_type.unit] {
            if index < 0 || index as usize >= raw.string_table.len() {
                return Err(ReadError::Malformed(format!(
                    "sample type {position} refers to string {index}, but the string table has {} entries",
                    raw.string_table.len()
                )));
            }
            let length = raw.string_table[index as usize].len();
            if length > MAX_SAMPLE_TYPE_BYTES {
                return Err(ReadError::Malformed(format!(
                    "sample type {position} has a name or unit of {length} bytes (at most {MAX_SAMPLE_TYPE_BYTES})"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::memory_estimate::memory_estimate;
    use std::io::Write;

    /// A test sample: frames (name, file, line) leaf first, values, class.
    pub(crate) type TestSample<'a> = (&'a [(&'a str, &'a str, i64)], &'a [i64], Option<&'a str>);

    /// A small hand-made profile: two sample types, three functions, and a
    /// sample of each stack given as (function names leaf first, values, class).
    pub(crate) fn profile_from(types: &[(&str, &str)], samples: &[TestSample]) -> pprof::Profile {
        let mut strings = vec![String::new()];
        let mut intern = |s: &str| -> i64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as i64;
            }
            strings.push(s.to_string());
            (strings.len() - 1) as i64
        };
        let mut profile = pprof::Profile::default();
        for (t, u) in types {
            profile.sample_type.push(pprof::ValueType {
                r#type: intern(t),
                unit: intern(u),
            });
        }
        let mut functions: Vec<(String, String)> = Vec::new();
        let mut locations: Vec<(u64, i64)> = Vec::new();
        for (stack, values, class) in samples {
            let mut location_id = Vec::new();
            for (name, file, line) in stack.iter() {
                let key = (name.to_string(), file.to_string());
                let function_id = match functions.iter().position(|f| *f == key) {
                    Some(i) => i as u64 + 1,
                    None => {
                        functions.push(key);
                        profile.function.push(pprof::Function {
                            id: functions.len() as u64,
                            name: intern(name),
                            system_name: 0,
                            filename: intern(file),
                            start_line: 0,
                        });
                        functions.len() as u64
                    }
                };
                let id = match locations.iter().position(|l| *l == (function_id, *line)) {
                    Some(i) => i as u64 + 1,
                    None => {
                        locations.push((function_id, *line));
                        profile.location.push(pprof::Location {
                            id: locations.len() as u64,
                            mapping_id: 0,
                            address: 0,
                            line: vec![pprof::Line {
                                function_id,
                                line: *line,
                                column: 0,
                            }],
                            is_folded: false,
                        });
                        locations.len() as u64
                    }
                };
                location_id.push(id);
            }
            let label = match class {
                Some(class) => vec![pprof::Label {
                    key: intern("class"),
                    str: intern(class),
                    num: 0,
                    num_unit: 0,
                }],
                None => Vec::new(),
            };
            profile.sample.push(pprof::Sample {
                location_id,
                value: values.to_vec(),
                label,
            });
        }
        profile.string_table = strings;
        profile
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn small() -> pprof::Profile {
        profile_from(
            &[("alloc_space", "bytes"), ("inuse_space", "bytes")],
            &[
                (
                    &[("String#*", "a.rb", 3), ("A#run", "a.rb", 3)],
                    &[100, 10],
                    Some("String"),
                ),
                (&[("A#run", "a.rb", 5)], &[50, 0], None),
            ],
        )
    }

    /// A string table repeating a label key and value at every sample:
    /// grouping by the key stays one comparison per label, and the
    /// repeats are one key and one value.
    #[test]
    fn label_values_are_found_by_canonical_index_however_often_the_key_repeats() {
        let mut raw = small();
        let samples = 100_000;
        let template = raw.sample[0].clone();
        raw.sample.clear();
        for i in 0..samples {
            let key = raw.string_table.len() as i64;
            raw.string_table.push("endpoint".into());
            raw.string_table
                .push(if i % 2 == 0 { "a" } else { "b" }.into());
            let mut sample = template.clone();
            sample.label = vec![pprof::Label {
                key,
                str: key + 1,
                num: 0,
                num_unit: 0,
            }];
            raw.sample.push(sample);
        }
        let profile = DecodedProfile::from_raw(raw).unwrap();
        let values = profile.sample_label_values("endpoint");
        let distinct: std::collections::BTreeSet<_> = values.iter().copied().collect();
        assert_eq!(distinct.len(), 2, "{distinct:?}");
        assert!(values.iter().all(Option::is_some));
        assert!(profile
            .sample_label_values("class")
            .iter()
            .all(Option::is_none));
        assert!(profile
            .missing_label("nope")
            .starts_with("no sample has a label"));
    }

    #[test]
    fn reads_plain_and_gzipped() {
        let bytes = small().encode_to_vec();
        for input in [bytes.clone(), gzip(&bytes)] {
            let profile = DecodedProfile::decode(&input).unwrap();
            assert_eq!(profile.sample_count(), 2);
            let names: Vec<&str> = profile.stack(0).map(|f| profile.string(f.name)).collect();
            assert_eq!(names, ["String#*", "A#run"]);
            assert_eq!(
                profile.sample_class[0].map(|c| profile.string(c)),
                Some("String")
            );
            assert_eq!(profile.sample_class[1], None);
            assert_eq!(profile.values(0).collect::<Vec<_>>(), [100, 50]);
        }
    }

    #[test]
    fn clear_errors_for_files_that_are_not_profiles() {
        assert_eq!(DecodedProfile::decode(b"").err(), Some(ReadError::Empty));
        let text = DecodedProfile::decode(b"hello, this is a text file\n")
            .err()
            .unwrap();
        assert!(matches!(text, ReadError::NotPprof(_)), "{text:?}");
        let gz = gzip(&small().encode_to_vec());
        let truncated = DecodedProfile::decode(&gz[..gz.len() / 2]).err();
        assert_eq!(truncated, Some(ReadError::TruncatedGzip));
        let mut twice = gz.clone();
        twice.extend_from_slice(&gz);
        assert_eq!(
            DecodedProfile::decode(&twice).err(),
            Some(ReadError::TrailingData)
        );
        let mut corrupt = gz.clone();
        let middle = corrupt.len() / 2;
        corrupt[middle] ^= 0xff;
        corrupt[middle + 1] ^= 0xff;
        assert!(DecodedProfile::decode(&corrupt).is_err());
        // A JSON file and a PNG header: not pprof, no panic.
        assert!(DecodedProfile::decode(b"{\"a\": 1}").is_err());
        assert!(DecodedProfile::decode(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").is_err());
    }

    #[test]
    fn dangling_references_are_malformed() {
        let mut raw = small();
        raw.sample[0].location_id.push(99);
        let error = DecodedProfile::from_raw(raw).err().unwrap();
        assert_eq!(
            error.to_string(),
            "malformed pprof profile: sample 0 refers to location 99, which does not exist"
        );
        let mut raw = small();
        raw.function[0].name = 1000;
        assert!(matches!(
            DecodedProfile::from_raw(raw),
            Err(ReadError::Malformed(_))
        ));
        let mut raw = small();
        raw.sample[1].value.pop();
        assert!(matches!(
            DecodedProfile::from_raw(raw),
            Err(ReadError::Malformed(_))
        ));
    }

    #[test]
    fn crafted_profiles_are_refused_not_panicked_on() {
        let mut raw = small();
        raw.drop_frames = 999;
        assert!(matches!(
            DecodedProfile::from_raw(raw),
            Err(ReadError::Malformed(_))
        ));
        let mut raw = small();
        raw.keep_frames = -1;
        assert!(matches!(
            DecodedProfile::from_raw(raw),
            Err(ReadError::Malformed(_))
        ));
        // 2 million empty strings: 4 MB on the wire, about 100 MB decoded.
        let mut bomb = small();
        bomb.string_table
            .extend(std::iter::repeat_n(String::new(), 2_000_000));
        let bytes = bomb.encode_to_vec();
        let estimate = decode_memory_estimate(&bytes).unwrap();
        assert!(estimate >= 2_000_000 * 48, "{estimate}");
        assert!(estimate < READ_BUDGET.limit(), "still readable");
        // A real profile's estimate is small.
        assert!(decode_memory_estimate(&small().encode_to_vec()).unwrap() < 10_000);
    }

    #[test]
    fn a_message_in_memory_is_estimated_as_its_encoding_would_be() {
        let mut raw = small();
        raw.comment = vec![1, 2];
        raw.sample[0].label.push(pprof::Label::default());
        raw.location.push(pprof::Location {
            id: 99,
            ..Default::default()
        });
        let wire = decode_memory_estimate(&raw.encode_to_vec()).unwrap();
        assert_eq!(memory_estimate(&raw), wire);
    }

    #[test]
    fn a_decoded_profile_holds_its_estimate_until_freed() {
        let budget = crate::read_budget::test_budget(1 << 30);
        let raw = small();
        let plain = raw.encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        let profile = DecodedProfile::decode_within(&gz, budget).unwrap();
        assert_eq!(profile.reserved_bytes(), memory_estimate(&raw));
        assert_eq!(budget.held(), profile.reserved_bytes());
        drop(profile);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn profiles_read_together_share_one_limit() {
        let raw = small();
        let bytes = raw.encode_to_vec();
        let one = memory_estimate(&raw);
        let budget = crate::read_budget::test_budget(2 * one + one / 2);
        let first = DecodedProfile::decode_within(&bytes, budget).unwrap();
        let second = DecodedProfile::decode_within(&bytes, budget).unwrap();
        let error = DecodedProfile::decode_within(&bytes, budget).err().unwrap();
        assert!(
            matches!(error, ReadError::OverBudget(refused) if refused.held == 2 * one),
            "{error}"
        );
        assert!(error
            .to_string()
            .starts_with("reading this profile would take about"));
        assert!(error.to_string().contains("the profiles already read hold"));
        drop(first);
        assert!(DecodedProfile::decode_within(&bytes, budget).is_ok());
        drop(second);
        assert_eq!(budget.held(), 0, "refusals hold nothing");
    }

    #[test]
    fn gzip_too_short_for_a_trailer_is_refused_not_panicked_on() {
        for bytes in [&b"\x1f\x8b"[..], b"\x1f\x8b\x08"] {
            assert!(DecodedProfile::decode(bytes).is_err());
        }
    }

    #[test]
    fn decompressed_bytes_are_reserved_as_they_grow() {
        // 64 MB of zeros gzip to ~64 KB; a 16 MB budget stops the gunzip
        // before it has allocated past the limit.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&vec![0u8; test_support::miri_scaled(64 << 20)])
            .unwrap();
        let gz = gz.finish().unwrap();
        let budget = crate::read_budget::test_budget(16 << 20);
        let (error, peak) = test_support::counting_alloc::peak_bytes_during(|| {
            DecodedProfile::decode_within(&gz, budget).err()
        });
        if cfg!(miri) {
            return;
        }
        assert!(matches!(error, Some(ReadError::OverBudget(_))), "{error:?}");
        assert!(peak <= 17 << 20, "{peak} bytes");
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn totals_saturate() {
        let mut raw = small();
        raw.sample[0].value[0] = i64::MAX;
        raw.sample[1].value[0] = i64::MAX;
        let profile = DecodedProfile::from_raw(raw).unwrap();
        assert_eq!(profile.total(0), i64::MAX);
    }

    #[test]
    fn sample_index_by_name_default_and_last() {
        let mut raw = small();
        let profile = DecodedProfile::from_raw(raw.clone()).unwrap();
        assert_eq!(profile.sample_index(None), Ok(1));
        assert_eq!(profile.sample_index(Some("alloc_space")), Ok(0));
        let error = profile.sample_index(Some("cpu")).err().unwrap();
        assert!(error.contains("alloc_space, inuse_space"), "{error}");
        raw.default_sample_type = raw.sample_type[0].r#type;
        let profile = DecodedProfile::from_raw(raw.clone()).unwrap();
        assert_eq!(profile.sample_index(None), Ok(0));
        // A default naming no sample type: the last one, as Go does.
        raw.string_table.push("cpu".to_string());
        raw.default_sample_type = (raw.string_table.len() - 1) as i64;
        let profile = DecodedProfile::from_raw(raw).unwrap();
        assert_eq!(profile.sample_index(None), Ok(1));
    }

    #[test]
    fn locations_without_symbols_are_named_by_address() {
        let mut raw = small();
        raw.string_table.push("/usr/lib/libfoo.so".to_string());
        raw.mapping.push(pprof::Mapping {
            id: 7,
            filename: (raw.string_table.len() - 1) as i64,
            ..Default::default()
        });
        raw.location.push(pprof::Location {
            id: 50,
            mapping_id: 7,
            address: 0x1234,
            line: Vec::new(),
            is_folded: false,
        });
        raw.sample[1].location_id.insert(0, 50);
        let profile = DecodedProfile::from_raw(raw).unwrap();
        let leaf = profile.stack(1).next().unwrap();
        assert_eq!(profile.string(leaf.name), "libfoo.so 0x1234");
    }

    #[test]
    fn to_pprof_changes_only_the_default() {
        let profile = DecodedProfile::from_raw(small()).unwrap();
        let written = profile.to_pprof(Some("alloc_space")).unwrap();
        let again = DecodedProfile::decode(&written.bytes).unwrap();
        assert_eq!(again.sample_index(None), Ok(0));
        assert_eq!(again.raw.sample, profile.raw.sample);
        assert!(profile.to_pprof(Some("nope")).is_err());
    }
}
