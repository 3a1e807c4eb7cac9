//! `include/nccl.h` is generated from the Rust definitions by cbindgen; this
//! test fails when the committed header is stale. Set OXCCL_BLESS_HEADER=1
//! to rewrite it.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut out);
    let fresh = String::from_utf8(out).expect("utf-8");
    let path = dir.join("include/nccl.h");
    if std::env::var_os("OXCCL_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/nccl.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/nccl.h is stale: run `OXCCL_BLESS_HEADER=1 cargo test -p oxccl-capi --test header`"
    );
}
