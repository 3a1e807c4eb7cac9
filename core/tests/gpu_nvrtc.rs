//! The device source compiles with NVRTC for Hopper for every datatype,
//! into the disk cache. Needs NVRTC, not a GPU.

use std::time::Instant;

use oxccl::cuda::{kernels, nvrtc};
use oxccl::DataType;

#[test]
fn every_datatype_compiles_for_sm90() {
    if let Err(e) = nvrtc::version() {
        println!("skipped: {e}");
        return;
    }
    // A cache of its own unless the caller points at one (to warm it).
    if std::env::var_os("OXCCL_CACHE_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("oxccl-nvrtc-test-{}", std::process::id()));
        std::env::set_var("OXCCL_CACHE_DIR", &dir);
    }
    let t = Instant::now();
    kernels::precompile((9, 0), &DataType::ALL).unwrap();
    println!(
        "compiled or loaded every datatype in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}
