//! A rank stopped with SIGSTOP while the others run: they fail within
//! NCCL_TIMEOUT naming it, and `oxccl perf --ranks N` then ends it and exits
//! non-zero, instead of waiting for it for ever.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The child of `parent` whose environment says it is `rank`.
fn rank_pid(parent: u32, rank: usize) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .map(|e| {
                    e.split(|b| *b == 0)
                        .any(|kv| kv == format!("OXCCL_RANK={rank}").as_bytes())
                })
                .unwrap_or(false)
        })
}

#[test]
fn a_stopped_rank_is_ended_after_the_others_fail() {
    let timeout_s = 3;
    let mut perf = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args(["perf", "--ranks", "3", "--op", "all_reduce"])
        .args(["-b", "8", "-e", "8", "-n", "100000000", "-w", "1"])
        .env("NCCL_TIMEOUT", timeout_s.to_string())
        .env("NCCL_SOCKET_IFNAME", "lo")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxccl perf");
    let start = Instant::now();
    let victim = loop {
        if let Some(p) = rank_pid(perf.id(), 2) {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank 2 never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let the ranks get into their loop of all-reduces.
    std::thread::sleep(Duration::from_millis(1500));
    let stopped = Instant::now();
    assert!(Command::new("kill")
        .args(["-STOP", &victim.to_string()])
        .status()
        .expect("kill")
        .success());
    let limit = Duration::from_secs(60);
    while perf.try_wait().expect("poll").is_none() {
        if stopped.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-KILL", &victim.to_string()])
                .status();
            let _ = perf.kill();
            panic!("oxccl perf still waits {limit:?} after rank 2 was stopped");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = stopped.elapsed();
    let out = perf.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit status 0 with a stopped rank:\n{err}"
    );
    // The others' timeout, the launcher's grace after the first failure
    // (NCCL_TIMEOUT + 2 s), and slack for a loaded machine.
    assert!(
        took < Duration::from_secs(2 * timeout_s + 2 + 10),
        "took {took:?} after the stop:\n{err}"
    );
    assert!(err.contains("(the first to fail)"), "{err}");
    assert!(err.contains("rank 2 was still running"), "{err}");
    assert!(
        err.contains("ranks not answering (dead or hung): 2"),
        "{err}"
    );
    eprintln!("ended {took:?} after the stop:\n{err}");
}
