//! A live view of a running job (docs/faults.md, "A live view: oxccl
//! ras"): four processes run all-reduces on host memory with RAS on a port
//! of their own; rank 2 SIGSTOPs itself between two of them, so the other
//! three wait inside the next. `oxccl ras` (the CLI's client, run here in
//! the test process) must then name rank 2 as missing, with its process,
//! and the operation (AllReduce and its number) the others are stuck in.
//! Where OXCCL_NCCLRAS names an `ncclras` built from NCCL's source
//! (tools/build_ncclras.sh), NCCL's own client must print the same names.
//! Bounded: the victim is SIGKILLed once seen, the survivors then fail
//! and end; the harness kills whatever is left after 90 s.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, raise, Signal};
use nix::unistd::Pid;
use oxccl::{DataType, RedOp};
use oxccl_cli::ras::RasArgs;
use oxccl_tests::{as_child, spawn, Rank};

const NAME: &str = "a_stopped_rank_is_named_with_its_operation";
const VICTIM: usize = 2;

fn rank_body(r: Rank) {
    let comm = r.comm(&[]);
    let t0 = Instant::now();
    let mut buf = vec![0u8; 4096];
    let mut i = 0u64;
    let mut stopped = false;
    while t0.elapsed() < Duration::from_secs(60) {
        if r.rank == VICTIM && !stopped && t0.elapsed() > Duration::from_secs(2) {
            stopped = true;
            println!("STOPPING after {i} all-reduces");
            raise(Signal::SIGSTOP).expect("SIGSTOP myself");
        }
        if let Err(e) = comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum) {
            println!("ENDED after {i} all-reduces: {e}");
            break;
        }
        i += 1;
    }
    comm.abort();
}

fn ask(port: u16, verbose: bool) -> Result<String, String> {
    let a = RasArgs {
        host: "127.0.0.1".into(),
        port,
        timeout: Some(1),
        verbose,
        format: None,
        help: None,
    };
    let mut out = Vec::new();
    oxccl_cli::ras::query(&a, &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The pid in the rank table's row of `rank` marked MISSING.
fn missing_pid(report: &str, rank: usize) -> Option<i32> {
    report.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() > 4 && w[0] == rank.to_string() && w[4] == "MISSING")
            .then(|| w[1].parse().ok())
            .flatten()
    })
}

/// What both clients must print of the stopped rank.
fn assert_names_the_victim(who: &str, report: &str, pid: i32) {
    for want in [
        "RUNNING  INCOMPLETE".to_string(),
        format!("Rank {VICTIM} -- process {pid} on node 127.0.0.1 (host memory)"),
        format!("Rank {VICTIM} is missing (no answer within 1.0 s): it has not finished AllReduce (operation "),
        "3 ranks have been in AllReduce (operation ".to_string(),
        "TIMEOUT\n  Encountered 1 communication timeout".to_string(),
    ] {
        assert!(report.contains(&want), "{who} lacks {want:?}:\n{report}");
    }
}

#[test]
fn a_stopped_rank_is_named_with_its_operation() {
    if as_child(NAME, rank_body) {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let watcher = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut healthy = None;
        while t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(300));
            let Ok(r) = ask(port, false) else { continue };
            let Some(pid) = missing_pid(&r, VICTIM) else {
                if r.contains("Communicators") && !r.contains("No communicator data") {
                    healthy.get_or_insert(r);
                }
                continue;
            };
            if !r.contains("(stuck)") {
                continue;
            }
            let ncclras = std::env::var("OXCCL_NCCLRAS").ok().map(|bin| {
                let out = std::process::Command::new("timeout")
                    .args([
                        "30",
                        &bin,
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &port.to_string(),
                        "-t",
                        "1",
                    ])
                    .output()
                    .expect("run ncclras");
                String::from_utf8_lossy(&out.stdout).into_owned()
            });
            // Ends the job: the survivors' all-reduce fails at once.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            return Ok((healthy, r, ncclras, pid, t0.elapsed()));
        }
        Err(format!(
            "no report named rank {VICTIM} missing within 60 s; the last healthy one:\n{}",
            healthy.unwrap_or_default()
        ))
    });
    let done = spawn(
        NAME,
        4,
        &[("NCCL_RAS_ADDR", &addr), ("OXCCL_RAS_STUCK_S", "0.5")],
        Duration::from_secs(90),
    );
    let (healthy, report, ncclras, pid, took) = watcher
        .join()
        .expect("the watcher")
        .unwrap_or_else(|e| panic!("{e}\n{done:#?}"));
    if let Some(h) = &healthy {
        eprintln!("--- before the stop:\n{h}");
        assert!(h.contains("Job summary"), "{h}");
    }
    eprintln!("--- oxccl ras, {took:?} after the job started:\n{report}");
    assert_names_the_victim("oxccl ras", &report, pid);
    if let Some(n) = ncclras {
        eprintln!("--- ncclras:\n{n}");
        assert_names_the_victim("ncclras", &n, pid);
    }
    for f in &done {
        if f.rank != VICTIM {
            assert!(
                f.stdout.contains("ENDED") || f.status.is_some_and(|s| s.success()),
                "rank {} did not end: {:?}\n{}\n{}",
                f.rank,
                f.status,
                f.stdout,
                f.stderr
            );
        }
    }
}
