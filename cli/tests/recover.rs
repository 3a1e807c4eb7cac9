//! `oxccl recover` runs: its survivors recover from the killed rank, shrink
//! by the exclude list their errors name, and check their all-reduces after
//! (#wrong 0, every survivor reporting). Its times are not checked: it is a
//! benchmark.

use std::process::Command;

#[test]
fn recover_reports_every_survivor_with_nothing_wrong() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args(["recover", "--ranks", "3", "--runs", "1", "--mode", "abort"])
        .env("NCCL_TIMEOUT", "4")
        .output()
        .expect("run oxccl recover");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{text}\n{err}", out.status);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    // shm and net, abort: 2 survivors each, 0 wrong.
    assert_eq!(rows.len(), 2, "{text}");
    for r in &rows {
        assert_eq!((r[0], r[3], r[7]), ("3", "2/2", "0"), "{text}");
    }
}
