//! What the GPU tests of `oxccl perf` share.

use std::process::Command;

/// `oxccl perf`: OXCCL_BIN where the test runs on another machine than it
/// was built on, else the binary cargo built beside the test.
pub fn perf_command() -> Command {
    let bin = std::env::var("OXCCL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_oxccl").into());
    let mut cmd = Command::new(bin);
    cmd.arg("perf").env("NCCL_SOCKET_IFNAME", "lo");
    cmd
}

/// Runs `cmd` and returns its stdout and stderr, asserting that it
/// succeeded with every result checked and right (`what` names the run).
pub fn checked(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().expect("run oxccl perf");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("Out of bounds values : 0 OK"),
        "oxccl perf {what} failed:\n{text}"
    );
    text
}
