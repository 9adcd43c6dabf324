use std::env;
use std::path::PathBuf;

/// Ruby versions whose C API differs in ways the binding layer cares about.
/// rb-sys tells dependents which it was built against (DEP_RB_VERSION_GTE_*);
/// each becomes `cfg(ruby_gte_X_Y)` so version-specific calls are gated.
const RUBY_VERSION_GATES: [(u32, u32); 4] = [(3, 2), (3, 3), (3, 4), (4, 0)];

fn main() {
    for (major, minor) in RUBY_VERSION_GATES {
        println!("cargo:rustc-check-cfg=cfg(ruby_gte_{major}_{minor})");
        let key = format!("DEP_RB_VERSION_GTE_{major}_{minor}");
        println!("cargo:rerun-if-env-changed={key}");
        if env::var(&key).as_deref() == Ok("true") {
            println!("cargo:rustc-cfg=ruby_gte_{major}_{minor}");
        }
    }
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
