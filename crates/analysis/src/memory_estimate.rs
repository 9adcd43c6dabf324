//! What a profile takes in memory once decoded, estimated before decoding
//! it (from one pass over its wire format) or from a message already in
//! memory (a merge's result), so that the read budget is asked first.

use prost::Message;

/// The message holds protobuf groups, which pprof never uses (prost skips
/// them, so the estimate could not see what follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldsGroups;

/// Protobuf's wire format, read just enough to count what a message holds.
struct Wire<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// One field of a message: its number, and its bytes if length-delimited.
enum WireField<'a> {
    Scalar(u64),
    Bytes(u64, &'a [u8]),
    /// A group's start or end (wire types 3 and 4): proto2's, never pprof's.
    /// prost skips groups, so the estimate could not see what follows.
    Group,
}

impl<'a> Wire<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Wire { bytes, at: 0 }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// The next field, or None at the end or at bytes that are not protobuf
    /// (prost then reports what is wrong).
    fn next_field(&mut self) -> Option<WireField<'a>> {
        let key = self.varint()?;
        let number = key >> 3;
        match key & 7 {
            0 => self.varint().map(|_| WireField::Scalar(number)),
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                self.at = self.at.checked_add(width)?;
                (self.at <= self.bytes.len()).then_some(WireField::Scalar(number))
            }
            2 => {
                let length = usize::try_from(self.varint()?).ok()?;
                let end = self.at.checked_add(length)?;
                let bytes = self.bytes.get(self.at..end)?;
                self.at = end;
                Some(WireField::Bytes(number, bytes))
            }
            3 | 4 => Some(WireField::Group),
            _ => None,
        }
    }
}

/// How many varints a packed repeated field holds (one per final byte).
fn packed_count(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|b| **b & 0x80 == 0).count() as u64
}

/// What decoding costs in memory, per item: prost's struct (twice: a Vec's
/// spare capacity) plus what `from_raw` indexes it with. Sizes from
/// size_of on x86_64 (Sample 72, Location 56, Line 24, Label 32, Function 40,
/// Mapping 56, String 24), rounded up; hash map entries count 32 bytes.
mod cost {
    pub const SAMPLE: u64 = 2 * 72 + 3 * 16 + 24 + 16 + 8 + 8;
    /// A location id or value of a sample (and the id's copy in the index).
    pub const SAMPLE_NUMBER: u64 = 2 * 8 + 4;
    pub const LABEL: u64 = 2 * 32;
    pub const LOCATION: u64 = 2 * 56 + 16 + 24 + 16 + 8 + 32;
    /// A line of a location: its struct, the frame it may add (FrameInfo 32
    /// in a Vec and a map), its slot in the location's frame list.
    pub const LINE: u64 = 2 * 24 + 2 * 32 + 32 + 4;
    /// The name made for a location without lines ("libfoo.so 0x1234", its
    /// binary cut at 64 characters of up to 4 bytes) and its frame.
    pub const UNSYMBOLIZED_NAME: u64 = 64 * 4 + 24 + 16 + 24 + 2 * 32 + 32 + 4;
    pub const FUNCTION: u64 = 2 * 40 + 32;
    pub const MAPPING: u64 = 2 * 56 + 32;
    pub const VALUE_TYPE: u64 = 2 * 16;
    /// A string, plus its bytes: the String, its heap block, its entry in
    /// the canonical-string map and index.
    pub const STRING: u64 = 2 * 24 + 16 + 32 + 4;
    pub const NUMBER: u64 = 2 * 8;
}

/// An upper estimate of the memory decoding `plain` takes (prost's message
/// and `from_raw`'s indexes), from one pass over the wire format that looks
/// inside samples and locations too: an empty label or line is 2 bytes on
/// the wire and 24-32 in memory, so counting bytes alone would not do.
pub fn decode_memory_estimate(plain: &[u8]) -> Result<u64, HoldsGroups> {
    let groups = || HoldsGroups;
    let mut estimate = 0u64;
    let mut add = |n: u64| estimate = estimate.saturating_add(n);
    let mut profile = Wire::new(plain);
    while let Some(field) = profile.next_field() {
        match field {
            WireField::Group => return Err(groups()),
            WireField::Bytes(2, sample) => {
                add(cost::SAMPLE);
                let mut inner = Wire::new(sample);
                while let Some(field) = inner.next_field() {
                    match field {
                        WireField::Group => return Err(groups()),
                        WireField::Bytes(1 | 2, packed) => {
                            add(packed_count(packed).saturating_mul(cost::SAMPLE_NUMBER))
                        }
                        WireField::Scalar(1 | 2) => add(cost::SAMPLE_NUMBER),
                        WireField::Bytes(3, _) => add(cost::LABEL),
                        _ => {}
                    }
                }
            }
            WireField::Bytes(4, location) => {
                add(cost::LOCATION);
                let mut lines = 0u64;
                let mut inner = Wire::new(location);
                while let Some(field) = inner.next_field() {
                    match field {
                        WireField::Group => return Err(groups()),
                        WireField::Bytes(4, _) => lines += 1,
                        _ => {}
                    }
                }
                add(if lines == 0 {
                    cost::UNSYMBOLIZED_NAME
                } else {
                    lines.saturating_mul(cost::LINE)
                });
            }
            WireField::Bytes(1 | 11, _) => add(cost::VALUE_TYPE),
            WireField::Bytes(3, _) => add(cost::MAPPING),
            WireField::Bytes(5, _) => add(cost::FUNCTION),
            WireField::Bytes(6, string) => add(cost::STRING + string.len() as u64),
            WireField::Bytes(13, packed) => add(packed_count(packed).saturating_mul(cost::NUMBER)),
            WireField::Scalar(13) => add(cost::NUMBER),
            _ => {}
        }
    }
    Ok(estimate)
}

/// `decode_memory_estimate` of a message already in memory (a merged
/// profile's): what reading its encoding back would reserve.
pub fn memory_estimate(raw: &pprof::Profile) -> u64 {
    let records = raw
        .sample
        .iter()
        .map(sample_estimate)
        .chain(raw.location.iter().map(location_estimate))
        .chain(raw.string_table.iter().map(|s| string_estimate(s)))
        .fold(0, u64::saturating_add);
    records
        .saturating_add(
            (raw.sample_type.len() + usize::from(raw.period_type.is_some())) as u64
                * cost::VALUE_TYPE,
        )
        .saturating_add(raw.mapping.len() as u64 * cost::MAPPING)
        .saturating_add(raw.function.len() as u64 * cost::FUNCTION)
        .saturating_add(raw.comment.len() as u64 * cost::NUMBER)
}

/// `memory_estimate`'s share of one sample.
pub fn sample_estimate(sample: &pprof::Sample) -> u64 {
    cost::SAMPLE
        + (sample.location_id.len() + sample.value.len()) as u64 * cost::SAMPLE_NUMBER
        + sample.label.len() as u64 * cost::LABEL
}

/// `memory_estimate`'s share of one location.
pub fn location_estimate(location: &pprof::Location) -> u64 {
    cost::LOCATION
        + if location.line.is_empty() {
            cost::UNSYMBOLIZED_NAME
        } else {
            location.line.len() as u64 * cost::LINE
        }
}

/// `memory_estimate`'s share of one string.
pub fn string_estimate(string: &str) -> u64 {
    cost::STRING + string.len() as u64
}

/// `memory_estimate`'s share of one function and one mapping.
pub const FUNCTION_ESTIMATE: u64 = cost::FUNCTION;
pub const MAPPING_ESTIMATE: u64 = cost::MAPPING;

/// What reading back a profile whose estimate is `estimate` and whose
/// encoding takes `encoded` bytes reserves (see `read_back_estimate`).
pub fn read_back_bytes(estimate: u64, encoded: u64) -> u64 {
    estimate
        .saturating_add(encoded.saturating_mul(2) + encoded / 1000 + 1024)
        .saturating_add(2 * DECOMPRESS_CHUNK as u64)
}

/// At most what reading `raw` back from the gzipped encoding `to_pprof`
/// writes reserves at its peak: the decoded estimate, the decompressed
/// bytes (one buffer of their size, from gzip's trailer), the file's bytes
/// (gzip adds at most 0.1% and a few bytes to what it cannot compress) and
/// the chunk gunzip reads into.
pub fn read_back_estimate(raw: &pprof::Profile) -> u64 {
    read_back_bytes(memory_estimate(raw), raw.encoded_len() as u64)
}

/// What gunzip reads at a time, and its output's first capacity.
pub const DECOMPRESS_CHUNK: usize = 1 << 16;
