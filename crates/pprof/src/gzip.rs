//! Gzip, the form pprof tools read: a whole profile at once, or a stream
//! of protobuf fields (a message's fields may come in any order, so a
//! profile can be written sample by sample, its tables after them).

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::Profile;

/// A flush gzips inside the profiled process: a level faster than zlib's
/// default 6 for a few percent more bytes; the fastest levels cost far
/// more bytes (docs/performance.md, `examples/gzip_levels.rs`).
pub const LEVEL: u32 = 4;

/// Serialises and gzips a profile, the form pprof tools read (the tests'
/// reference for `heap_profile::build_profile_gzipped`, which the collector uses; and
/// how profiles read back are written again, see `analysis`).
pub fn encode_gzipped(profile: &Profile) -> Vec<u8> {
    gzip_bytes(&profile.encode_to_vec())
}

/// Gzips an encoded profile into `out` (a writer that may refuse to grow).
pub fn gzip_to<W: Write>(raw: &[u8], out: W) -> std::io::Result<W> {
    let mut encoder = GzEncoder::new(out, Compression::new(LEVEL));
    encoder.write_all(raw)?;
    encoder.finish()
}

/// Gzips an encoded profile.
pub fn gzip_bytes(raw: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        Compression::new(LEVEL),
    );
    encoder
        .write_all(raw)
        .expect("writing to a Vec cannot fail");
    encoder.finish().expect("writing to a Vec cannot fail")
}

/// Protobuf fields gzipped as they are written, counting the uncompressed
/// bytes.
pub struct GzipStream {
    encoder: GzEncoder<Vec<u8>>,
    raw_len: usize,
    buffer: Vec<u8>,
}

impl Default for GzipStream {
    fn default() -> Self {
        Self::new()
    }
}

impl GzipStream {
    pub fn new() -> Self {
        GzipStream {
            encoder: GzEncoder::new(Vec::new(), Compression::new(LEVEL)),
            raw_len: 0,
            buffer: Vec::new(),
        }
    }

    /// Writes `message` as field `field` of the enclosing message.
    pub fn write_field(&mut self, field: u32, message: &impl Message) {
        self.buffer.clear();
        prost::encoding::message::encode(field, message, &mut self.buffer);
        self.write_raw_buffer();
    }

    /// Writes every field of `message` (as if it were the enclosing one).
    pub fn write_message(&mut self, message: &impl Message) {
        self.buffer.clear();
        message
            .encode(&mut self.buffer)
            .expect("a Vec grows as needed");
        self.write_raw_buffer();
    }

    fn write_raw_buffer(&mut self) {
        let buffer = std::mem::take(&mut self.buffer);
        self.write_raw(&buffer);
        self.buffer = buffer;
    }

    /// Writes bytes already encoded (whole protobuf fields).
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.encoder
            .write_all(bytes)
            .expect("writing to a Vec cannot fail");
        self.raw_len += bytes.len();
    }

    /// The gzipped bytes and the uncompressed size.
    pub fn finish(self) -> (Vec<u8>, usize) {
        let gz = self.encoder.finish().expect("writing to a Vec cannot fail");
        (gz, self.raw_len)
    }
}
