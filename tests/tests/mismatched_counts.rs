//! Ranks on different hosts that call one collective with different
//! counts fail within a bounded time, each naming the collective, its
//! number and both counts, long before NCCL_TIMEOUT (30 s here).
//!
//! Each rank is a host of its own (NCCL_HOSTID), so that every peer is
//! reached through the socket network and no shared memory tells a rank
//! what its peers called. The counts fall on both sides of a threshold
//! of the rings' and trees' plans (algorithm, channels, peers): before,
//! 3 or more ranks whose counts chose different plans waited on peers
//! that never came, and a rank whose count was 0 sent nothing at all,
//! so no operation header carried the mismatch and every rank waited the
//! whole NCCL_TIMEOUT.

use std::time::{Duration, Instant};

use oxccl::{Comm, DataType, RedOp};
use oxccl_cli::launch::{self, Output};
use oxccl_tests::as_child;

/// The harness's variable naming the child's case (see `oxccl_tests::as_child`).
const CHILD: &str = "OXCCL_TEST_CHILD";

/// How soon every rank must have named the mismatch (2 s asked; this
/// 2-core machine runs other builds beside the tests).
const NAMED_WITHIN: Duration = Duration::from_secs(5);

#[derive(Clone, Copy)]
enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
        }
    }

    /// Calls the collective with `count` floats (per rank where the
    /// collective counts that way), root 0.
    fn call(self, comm: &Comm, count: usize) -> oxccl::Result<()> {
        let n = comm.count();
        let bytes = count * 4;
        match self {
            Coll::AllReduce => {
                let mut b = vec![1u8; bytes];
                comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            }
            Coll::AllGather => {
                let mut b = vec![1u8; n * bytes];
                comm.all_gather(None, &mut b, DataType::Float32)
            }
            Coll::ReduceScatter => {
                let input = vec![1u8; n * bytes];
                let mut out = vec![0u8; bytes];
                comm.reduce_scatter(&input, &mut out, DataType::Float32, RedOp::Sum)
            }
            Coll::Broadcast => {
                let mut b = vec![1u8; bytes];
                comm.broadcast(None, &mut b, DataType::Float32, 0)
            }
        }
    }
}

/// `n` ranks, each a host of its own; after one call that agrees, the
/// odd ranks call `coll` with `a` floats and the even ranks (the root of
/// a broadcast among them) with `b`. Every rank
/// fails within [`NAMED_WITHIN`], naming the mismatched counts, the
/// collective and its number (#1) and both counts. A rank whose part
/// needs nothing from its peers returns at once, as under NCCL: a count
/// of 0 (it moves no data and waits on no one), the root of a broadcast
/// (its sends complete once the network has taken them); its next call
/// fails as soon, naming the same (it waits 2 s first: the others must
/// not need its next call).
fn counts_across_hosts(test: &str, name: &str, n: usize, coll: Coll, a: usize, b: usize) {
    if as_child(name, |r| {
        oxccl::log::init();
        let host = format!("host{}", r.rank);
        let comm = r.comm(&[("HOSTID", &host)]);
        coll.call(&comm, 4).unwrap();
        // Every rank out of that call before any fails the next: a rank
        // still waiting for its last message would take the others'
        // failure notice for its own.
        std::thread::sleep(Duration::from_millis(300));
        let count = if r.rank % 2 == 1 { a } else { b };
        let mut start = Instant::now();
        let mut got = coll.call(&comm, count);
        if got.is_ok() {
            // Its part needed nothing from its peers: a count of 0, or the
            // root of a broadcast whose sends the network took.
            assert!(
                count == 0 || matches!(coll, Coll::Broadcast) && r.rank == 0,
                "rank {}: a call of {count} with mismatched counts succeeded",
                r.rank
            );
            eprintln!("rank {}: call #1 returned; its next call fails", r.rank);
            // The others must find the mismatch without this rank's next
            // call (a program may compute for a while, or end, after it).
            std::thread::sleep(Duration::from_secs(2));
            start = Instant::now();
            // One that waits on its peers (another broadcast's root would
            // only send again).
            got = Coll::AllReduce.call(&comm, 4);
        }
        let took = start.elapsed();
        let e = got
            .expect_err("a call with mismatched counts succeeded")
            .to_string();
        eprintln!("rank {} after {took:?}: {e}", r.rank);
        assert!(took < NAMED_WITHIN, "named after {took:?}: {e}");
        for said in [
            "mismatched counts".to_string(),
            format!("{} #1 of ", coll.name()),
            format!("of {a} x float"),
            format!("of {b} x float"),
        ] {
            assert!(e.contains(&said), "rank {}: no {said:?} in {e}", r.rank);
        }
    }) {
        return;
    }
    let start = Instant::now();
    let args: Vec<String> = [test, "--exact", "--nocapture", "--test-threads=1"]
        .map(String::from)
        .to_vec();
    let vars: Vec<(String, String)> = [
        (CHILD, name),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_TIMEOUT", "30"),
        ("NCCL_DEBUG", "WARN"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec();
    let limit = Duration::from_secs(60);
    let done = launch::spawn(n, &args, &vars, Output::Capture, limit, limit).expect("spawn ranks");
    eprintln!("{name}: {n} ranks done after {:?}", start.elapsed());
    for f in &done {
        for line in f.stderr.lines().filter(|l| l.contains(" after ")) {
            eprintln!("  {line}");
        }
        assert!(
            f.status.is_some_and(|s| s.success()),
            "rank {}: {:?}\n{}\n{}",
            f.rank,
            f.status,
            f.stdout,
            f.stderr
        );
    }
}

/// The counts the issue names: across the inline size, one element over
/// it, across the rings' channel counts, and 0 against 1024.
const PAIRS: [(usize, usize); 4] = [(1024, 2048), (1024, 1025), (65536, 262_144), (0, 1024)];

/// Runs [`counts_across_hosts`] for every pair of [`PAIRS`], each on
/// ranks of its own: the children re-run this test (`test`), and each
/// takes the pair its harness variable names.
fn every_pair(test: &str, n: usize, coll: Coll) {
    let child = std::env::var(CHILD).ok();
    for (a, b) in PAIRS {
        let name = format!("{test}/{a}/{b}");
        if child.as_deref().is_some_and(|c| c != name) {
            continue;
        }
        counts_across_hosts(test, &name, n, coll, a, b);
    }
}

#[test]
fn all_reduce_3_hosts() {
    every_pair("all_reduce_3_hosts", 3, Coll::AllReduce);
}

#[test]
fn all_reduce_4_hosts() {
    every_pair("all_reduce_4_hosts", 4, Coll::AllReduce);
}

#[test]
fn all_gather_3_hosts() {
    every_pair("all_gather_3_hosts", 3, Coll::AllGather);
}

#[test]
fn all_gather_4_hosts() {
    every_pair("all_gather_4_hosts", 4, Coll::AllGather);
}

#[test]
fn reduce_scatter_3_hosts() {
    every_pair("reduce_scatter_3_hosts", 3, Coll::ReduceScatter);
}

#[test]
fn reduce_scatter_4_hosts() {
    every_pair("reduce_scatter_4_hosts", 4, Coll::ReduceScatter);
}

#[test]
fn broadcast_3_hosts() {
    every_pair("broadcast_3_hosts", 3, Coll::Broadcast);
}

#[test]
fn broadcast_4_hosts() {
    every_pair("broadcast_4_hosts", 4, Coll::Broadcast);
}
