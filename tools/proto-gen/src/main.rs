//! Prints the Rust code prost-build generates for proto/profile.proto.
//!
//! Usage: proto-gen PROTO_DIR OUT_DIR. script/generate-proto adds the
//! header and writes (or, with --check, compares) crates/pprof/src/proto.rs.

use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let [proto_dir, out_dir] = args.as_slice() else {
        eprintln!("usage: proto-gen PROTO_DIR OUT_DIR");
        return ExitCode::from(2);
    };
    let mut config = prost_build::Config::new();
    if env::var_os("PROTOC").is_none() {
        match protoc_bin_vendored::protoc_bin_path() {
            Ok(path) => {
                config.protoc_executable(path);
            }
            Err(err) => {
                eprintln!("proto-gen: no bundled protoc here ({err}); set PROTOC=/path/to/protoc");
                return ExitCode::FAILURE;
            }
        }
    }
    let proto = PathBuf::from(proto_dir).join("profile.proto");
    match config
        .out_dir(out_dir)
        .compile_protos(&[proto], &[PathBuf::from(proto_dir)])
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("proto-gen: {err}");
            ExitCode::FAILURE
        }
    }
}
