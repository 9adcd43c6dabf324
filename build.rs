use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");

    let mut config = prost_build::Config::new();
    if env::var_os("PROTOC").is_none() {
        // The vendored protoc covers the common platforms; elsewhere the
        // user can point PROTOC at a system protoc.
        match protoc_bin_vendored::protoc_bin_path() {
            Ok(path) => {
                config.protoc_executable(path);
            }
            Err(err) => panic!(
                "no bundled protoc for this platform ({err}); install protoc and set PROTOC=/path/to/protoc"
            ),
        }
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    config
        .out_dir(&out_dir)
        .compile_protos(&["proto/profile.proto"], &["proto"])
        .expect("compiling proto/profile.proto");
}
