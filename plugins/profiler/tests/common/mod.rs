//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// The `liboxccl_profiler.so` cargo built for this test run.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("liboxccl_profiler.so"))
        .find(|p| p.exists())
        .expect("liboxccl_profiler.so next to the test binary (cargo builds the cdylib)")
}
