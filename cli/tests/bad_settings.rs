//! A bad setting stops `oxccl perf` with an error naming the variable and
//! what it accepts: never a panic (exit 101), a hang or a silent default.

use std::process::Command;

/// Runs a 2-rank `oxccl perf` with `name=value` and returns what it
/// printed, asserting it failed cleanly and named the variable.
fn refused(name: &str, value: &str, says: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args([
            "perf", "--ranks", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
        ])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env(name, value)
        .output()
        .expect("run oxccl perf");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let code = out.status.code();
    assert!(
        code.is_some_and(|c| c != 0 && c != 101),
        "{name}={value}: exit {code:?} (want an error, not success or a panic):\n{text}"
    );
    let named = format!("{name}={value:?}");
    assert!(
        text.contains(&named) && text.contains(says),
        "{name}={value}: no line names {named} and says {says:?}:\n{text}"
    );
    println!(
        "{name}={value}: exit {}; {}",
        code.unwrap_or(-1),
        first_error(&text)
    );
    text
}

fn first_error(text: &str) -> &str {
    text.lines()
        .find(|l| l.contains("invalid argument"))
        .unwrap_or("")
}

/// NCCL_TIMEOUT=inf and 1e30 panicked in the CLI (Duration overflow);
/// 0, -5 and NaN meant 1 ms.
#[test]
fn nccl_timeout_out_of_range() {
    for v in ["inf", "1e30", "0", "-5", "NaN"] {
        refused("NCCL_TIMEOUT", v, "from 0.001 to 31536000");
    }
}

/// Garbage in the host path's settings was ignored or defaulted, and
/// NCCL_BUFFSIZE=1 gave 64-byte slots: each now stops `oxccl perf` on host
/// memory with an error naming the variable.
#[test]
fn host_path_settings_refuse_garbage() {
    let cases = [
        ("OXCCL_HOST_DIRECT", "maybe", "expected 0 or 1"),
        ("OXCCL_HOST_DIRECT_MIN", "1Q", "expected a whole number"),
        ("OXCCL_HOST_DIRECT_THREADS", "0", "from 1 to 256"),
        ("OXCCL_HOST_DIRECT_SLICE", "big", "expected a whole number"),
        ("OXCCL_HOST_DIRECT_STREAM", "2", "expected 0 or 1"),
        (
            "OXCCL_HOST_DIRECT_P2P_MAX",
            "1.5M",
            "expected a whole number",
        ),
        ("OXCCL_HOST_MEMORY", "yes please", "expected 0 or 1"),
        ("OXCCL_PERF_HUGEPAGES", "huge", "expected 0 or 1"),
        ("NCCL_PROTO", "fast", "is no protocol"),
        ("NCCL_BUFFSIZE", "1", "from 64K to 512M"),
    ];
    for (name, value, says) in cases {
        refused(name, value, says);
    }
}
