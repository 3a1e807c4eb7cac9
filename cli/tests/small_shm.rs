//! A /dev/shm too small for the shared-memory segments (a container's
//! default, here a 1 MiB tmpfs in a private mount namespace): `oxccl perf`
//! ends with an error that names the segment's size, /dev/shm's room and
//! what to do, on every rank, instead of dying of SIGBUS at the first store
//! to a page the tmpfs could not give.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `oxccl`: OXCCL_BIN if set (a copy made aside, or a binary built
/// elsewhere), else the one cargo built beside this test.
fn oxccl_bin() -> String {
    std::env::var("OXCCL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_oxccl").into())
}

/// Whether this process may make a mount namespace with its own /dev/shm
/// (root, or a container that allows it); the reason when not.
fn private_shm_allowed() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"])
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "unshare -m + mount of a tmpfs refused ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn a_small_dev_shm_is_a_clear_error_not_sigbus() {
    if let Err(why) = private_shm_allowed() {
        eprintln!("SKIPPED a_small_dev_shm_is_a_clear_error_not_sigbus: {why}");
        return;
    }
    // The probe of issue 40: all_reduce from 8 B to 256 KiB, 2 ranks.
    let mut perf = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$@\"",
            "sh",
        ])
        .arg(oxccl_bin())
        .args(["perf", "--ranks", "2", "-b", "8", "-e", "256K", "-f", "4"])
        .args(["--time-limit", "60"])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "20")
        .env_remove("NCCL_SHM_DISABLE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxccl perf under unshare");
    let start = Instant::now();
    while perf.try_wait().expect("poll").is_none() {
        if start.elapsed() > Duration::from_secs(90) {
            let _ = perf.kill();
            panic!("oxccl perf still runs after 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = perf.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(1), "not a clean failure: {err}");
    assert!(!err.contains("SIGBUS") && !err.contains("signal"), "{err}");
    for rank in 0..2 {
        assert!(
            err.contains(&format!("rank {rank} exited with exit status: 2")),
            "rank {rank} did not fail cleanly:\n{err}"
        );
    }
    for said in [
        "cannot reserve ",
        "No space left on device",
        "/dev/shm has ",
        " free of 1048576 bytes (1.0 MiB)",
        "--shm-size",
        "NCCL_SHM_DISABLE=1",
    ] {
        assert!(
            err.contains(said),
            "the error does not say {said:?}:\n{err}"
        );
    }
}
