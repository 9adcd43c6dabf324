use std::env;

/// Ruby versions whose C API differs in ways the binding layer cares about.
/// rb-sys tells dependents which it was built against (DEP_RB_VERSION_GTE_*);
/// each becomes `cfg(ruby_gte_X_Y)` so version-specific calls are gated.
const RUBY_VERSION_GATES: [(u32, u32); 4] = [(3, 2), (3, 3), (3, 4), (4, 0)];

// The pprof messages are not generated here: crates/pprof/src/proto.rs is checked
// in (script/generate-proto), so building needs neither prost-build nor protoc.
fn main() {
    for (major, minor) in RUBY_VERSION_GATES {
        println!("cargo:rustc-check-cfg=cfg(ruby_gte_{major}_{minor})");
        let key = format!("DEP_RB_VERSION_GTE_{major}_{minor}");
        println!("cargo:rerun-if-env-changed={key}");
        if env::var(&key).as_deref() == Ok("true") {
            println!("cargo:rustc-cfg=ruby_gte_{major}_{minor}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
