//! NCCL_COMM_BLOCKING through the C API: 0 makes a communicator created
//! with no config non-blocking, so that rank 0 of two, whose peer never
//! comes, returns ncclInProgress at once; unset, the same call blocks
//! until NCCL_TIMEOUT and fails. Each case runs in a child process of this
//! test, whose environment it sets.

use std::process::Command;
use std::time::{Duration, Instant};

use nccl::types::{ncclComm_t, ncclResult_t, ncclUniqueId};

const CHILD: &str = "OXCCL_TEST_CHILD";
const NAME: &str = "nccl_comm_blocking_replaces_the_default";

/// In the child: rank 0 of 2 with no config; prints `RESULT <code>`.
fn child() {
    let mut id = ncclUniqueId { internal: [0; 128] };
    assert_eq!(nccl::ncclGetUniqueId(&mut id), ncclResult_t::ncclSuccess);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let r = nccl::ncclCommInitRank(&mut comm, 2, id, 0);
    println!("RESULT {}", r as i32);
    if !comm.is_null() {
        nccl::ncclCommAbort(comm);
    }
}

/// Runs the child with `blocking` as NCCL_COMM_BLOCKING (None: unset);
/// its result code and how long it took.
fn run(blocking: Option<&str>) -> (i32, Duration) {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(&exe);
    cmd.args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("OXCCL_HOST_MEMORY", "1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "2")
        .env_remove("NCCL_COMM_BLOCKING");
    if let Some(b) = blocking {
        cmd.env("NCCL_COMM_BLOCKING", b);
    }
    let t = Instant::now();
    let out = cmd.output().expect("run the child");
    let took = t.elapsed();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let code = text
        .lines()
        .find_map(|l| l.find("RESULT ").map(|i| l[i + 7..].trim().parse::<i32>()))
        .unwrap_or_else(|| panic!("NCCL_COMM_BLOCKING={blocking:?}: no RESULT:\n{text}"))
        .expect("a number");
    (code, took)
}

#[test]
fn nccl_comm_blocking_replaces_the_default() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let (code, took) = run(Some("0"));
    assert_eq!(code, ncclResult_t::ncclInProgress as i32, "took {took:?}");
    println!("NCCL_COMM_BLOCKING=0: ncclInProgress, child done in {took:?}");
    let (code, took) = run(None);
    assert!(
        code != ncclResult_t::ncclInProgress as i32 && code != ncclResult_t::ncclSuccess as i32,
        "unset: blocking, so the lone rank fails at NCCL_TIMEOUT: got {code}"
    );
    assert!(
        took >= Duration::from_secs(2),
        "unset: returned after {took:?}"
    );
    println!("unset: result {code} after {took:?}");
    let (code, _) = run(Some("1"));
    assert_ne!(code, ncclResult_t::ncclInProgress as i32);
}
