//! The ranks `oxccl perf --ranks N` starts die with it: a launcher killed
//! with SIGKILL (which it cannot catch) leaves no rank running on its own.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `oxccl`: OXCCL_BIN if set, else the one cargo built beside this test.
fn oxccl_bin() -> String {
    std::env::var("OXCCL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_oxccl").into())
}

fn children(parent: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The start time of process `pid` (field 22 of its stat line), and
/// whether it still runs (exists and is no zombie).
fn started(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(19)?.parse().ok()?, f.first() != Some(&"Z")))
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let n = 4;
    let mut perf = Command::new(oxccl_bin())
        .args(["perf", "--ranks", &n.to_string(), "--op", "all_reduce"])
        .args(["-b", "8", "-e", "8", "-n", "100000000", "-w", "1"])
        .args(["--time-limit", "120"])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "30")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start oxccl perf");
    let start = Instant::now();
    let ranks = loop {
        let c = children(perf.id());
        if c.len() == n {
            break c;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = perf.kill();
            let _ = perf.wait();
            panic!("the launcher started {} of {n} ranks", c.len());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let born: Vec<(u32, u64)> = ranks
        .iter()
        .filter_map(|&p| Some((p, started(p)?.0)))
        .collect();
    // Into their loop of all-reduces.
    std::thread::sleep(Duration::from_millis(1500));
    perf.kill().expect("SIGKILL the launcher");
    perf.wait().expect("reap the launcher");
    let killed = Instant::now();
    let running = || -> Vec<u32> {
        born.iter()
            .filter(|&&(p, t)| started(p).is_some_and(|(t2, alive)| t2 == t && alive))
            .map(|&(p, _)| p)
            .collect()
    };
    while !running().is_empty() && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = running();
    for p in &left {
        // Leave no orphan behind, whatever the verdict.
        let _ = Command::new("kill")
            .args(["-KILL", &p.to_string()])
            .status();
    }
    assert!(
        left.is_empty(),
        "ranks {left:?} of {ranks:?} still run 5 s after their launcher was killed"
    );
    eprintln!(
        "all {n} ranks gone {:?} after the launcher's SIGKILL",
        killed.elapsed()
    );
}
