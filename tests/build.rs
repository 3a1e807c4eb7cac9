//! Builds the C plugin fixtures (each a tiny shared library exporting one
//! NCCL plugin vtable, some deliberately broken) for tests/tests/plugins.rs.
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let compiler = cc::Build::new().get_compiler();
    for name in [
        "net_v8_nodev",
        "net_null",
        "net_initfail",
        "tuner_ring",
        "profiler_count",
        "profiler_v1",
        "net_with_tuner",
        "profiler_keep_name",
        "tuner_keep",
        "profiler_tree",
        "profiler_null_ctx",
        "net_v7_shim",
        "net_v6_shim",
        "net_v10_prof_shim",
        "env_fixture",
        "env_fixture_v1",
        "profiler_v7",
        "profiler_v6_shim",
        "collnet_v9",
        "collnet_v12",
        "collnet_v12_allreduce_only",
    ] {
        let src = format!("fixtures/{name}.c");
        println!("cargo:rerun-if-changed={src}");
        let lib = out.join(format!("lib{name}.so"));
        let status = compiler
            .to_command()
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .expect("running the C compiler");
        assert!(status.success(), "compiling {src} failed");
    }
    println!("cargo:rerun-if-changed=fixtures/common.h");
    println!("cargo:rerun-if-changed=fixtures/collnet_host.h");
    println!("cargo:rustc-env=OXCCL_FIXTURES={}", out.display());
}
