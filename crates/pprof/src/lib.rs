//! The pprof format: the protobuf messages (`proto`, generated from
//! proto/profile.proto), the string table, gzip, and the heap profile a
//! flush becomes (`heap_profile`).

#![forbid(unsafe_code)]

pub mod function_errors;
pub mod gzip;
pub mod heap_profile;
pub mod inuse_comment;
pub mod process_comment;
mod proto;
pub mod spread_comment;
pub mod string_table;

pub use gzip::encode_gzipped;
pub use proto::*;
