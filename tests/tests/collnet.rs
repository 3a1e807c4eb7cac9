//! All-reduce through a CollNet plugin (NCCL's CollNet chain on host
//! memory), with the host-reducing test plugin of fixtures/collnet_host.h
//! exported beside a net plugin that has no device. Nodes are processes
//! with their own NCCL_HOSTID: 2 ranks as 2 nodes (the v9 plugin, no
//! context), and 4 ranks as 2 nodes of 2 (the v12 plugin, a context per
//! communicator). Each runs all_reduce on random data, checked against the
//! host's reference, and checks that the collnet carried it: the core's
//! count of CollNet all-reduces, and the plugin's own log lines on each
//! node's first rank.
//!
//! All-gathers and reduce-scatters take the same path through the plugin's
//! `iallgather` and `ireducescatter` (NCCL's windows, 1 MiB at most here):
//! v9 as 2 nodes, v12 as 2 nodes of 2, with ranks numbered node by node or
//! not; a plugin that leaves them NULL runs them on the rings and says so.

use std::time::Duration;

use oxccl::{DataType, RedOp};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::{as_child, assert_all_ok, spawn};

fn fixture(name: &str) -> String {
    format!("{}/lib{name}.so", env!("OXCCL_FIXTURES"))
}

/// The calls each rank makes: (type, operation, bytes, in place). The last
/// is a type the plugin does not reduce (half precision), which runs on
/// the rings; 3 MiB is three of the plugin's 1 MiB pieces.
const CALLS: &[(DataType, RedOp, usize, bool)] = &[
    (DataType::Float32, RedOp::Sum, 8, false),
    (DataType::Float32, RedOp::Sum, 4096, true),
    (DataType::Float32, RedOp::Sum, 3 << 20, false),
    (DataType::Float64, RedOp::Max, 65536, false),
    (DataType::Int32, RedOp::Min, 1000, true),
    (DataType::Int64, RedOp::Prod, 4096, false),
    (DataType::Float16, RedOp::Sum, 4096, false),
];

/// Calls of [`CALLS`] the collnet carries, and the pieces they make.
const THROUGH_COLLNET: u64 = 6;
const PIECES: usize = 8;

/// A child rank: joins as a node of `per_node` ranks, runs the calls, and
/// prints how many all-reduces went through the CollNet.
fn body(per_node: usize) -> impl FnOnce(oxccl_tests::Rank) {
    move |r| {
        oxccl::log::init();
        let node = format!("collnet-node-{}", r.rank / per_node);
        let comm = r.comm(&[("HOSTID", &node)]);
        for &(dtype, op, size, inplace) in CALLS {
            let case = Case {
                coll: Coll::AllReduce,
                dtype,
                op,
                root: 0,
                size,
                inplace,
            };
            assert_eq!(case.check_once(&comm).unwrap(), 0, "{case:?}");
        }
        println!("COLLNET_USES {}", comm.collnet_uses());
        comm.destroy().unwrap();
    }
}

fn run(name: &str, nranks: usize, lib: &str, enable: &str) -> Vec<oxccl_cli::launch::Finished> {
    let done = spawn(
        name,
        nranks,
        &[
            ("NCCL_NET_PLUGIN", lib),
            ("NCCL_COLLNET_ENABLE", enable),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
        Duration::from_secs(120),
    );
    assert_all_ok(&done);
    done
}

fn uses(f: &oxccl_cli::launch::Finished) -> u64 {
    f.stdout
        .lines()
        .find_map(|l| l.split_once("COLLNET_USES ").map(|(_, n)| n.trim()))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("rank {} printed no count:\n{}", f.rank, f.stdout))
}

/// Checks every rank's count and each node's first rank's plugin lines.
fn assert_through_collnet(done: &[oxccl_cli::launch::Finished], per_node: usize, nodes: usize) {
    for f in done {
        assert_eq!(uses(f), THROUGH_COLLNET, "rank {}:\n{}", f.rank, f.stderr);
        let pieces = f
            .stderr
            .lines()
            .filter(|l| l.contains("collnet-host: iallreduce #"))
            .count();
        let leader = f.rank % per_node == 0;
        let want = if leader { PIECES } else { 0 };
        assert_eq!(
            pieces, want,
            "rank {} (leader: {leader}):\n{}",
            f.rank, f.stderr
        );
        if leader {
            let of = format!("of {nodes}");
            assert!(
                f.stderr
                    .contains(&format!("rank {} {of} joined group", f.rank / per_node)),
                "rank {}:\n{}",
                f.rank,
                f.stderr
            );
            assert!(
                f.stderr.contains(&format!("after {PIECES} iallreduce")),
                "rank {}: closeColl line missing:\n{}",
                f.rank,
                f.stderr
            );
        }
        println!(
            "rank {}: {} all_reduce through CollNet, {pieces} collnet pieces on this rank",
            f.rank,
            uses(f)
        );
    }
}

#[test]
fn collnet_v9_two_nodes_of_one_rank() {
    let name = "collnet_v9_two_nodes_of_one_rank";
    if as_child(name, body(1)) {
        return;
    }
    let lib = fixture("collnet_v9");
    let done = run(name, 2, &lib, "1");
    for f in &done {
        assert!(
            f.stderr.contains("ncclCollNetPlugin_v9")
                && f.stderr.contains("CollNet collnet-host-v9"),
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
    }
    assert_through_collnet(&done, 1, 2);
}

#[test]
fn collnet_v12_two_nodes_of_two_ranks() {
    let name = "collnet_v12_two_nodes_of_two_ranks";
    if as_child(name, body(2)) {
        return;
    }
    let lib = fixture("collnet_v12");
    let done = run(name, 4, &lib, "1");
    assert_through_collnet(&done, 2, 2);
}

/// Without NCCL_COLLNET_ENABLE=1 the plugin is found and never used.
#[test]
fn collnet_off_by_default() {
    let name = "collnet_off_by_default";
    if as_child(name, one_call) {
        return;
    }
    let lib = fixture("collnet_v12");
    let done = run(name, 2, &lib, "0");
    for f in &done {
        assert_eq!(uses(f), 0);
        assert!(
            f.stderr.contains("collnet plugin in")
                && !f.stderr.contains("collnet-host: iallreduce"),
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
    }
}

/// A child that runs one checked all_reduce as its own node and prints
/// how many went through the CollNet.
fn one_call(r: oxccl_tests::Rank) {
    oxccl::log::init();
    let node = format!("collnet-node-{}", r.rank);
    let comm = r.comm(&[("HOSTID", &node)]);
    let case = Case {
        coll: Coll::AllReduce,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 0,
        size: 4096,
        inplace: false,
    };
    assert_eq!(case.check_once(&comm).unwrap(), 0);
    println!("COLLNET_USES {}", comm.collnet_uses());
}

/// NCCL_ALGO forces an algorithm: the cost model then never picks CollNet.
#[test]
fn collnet_not_taken_when_an_algorithm_is_forced() {
    let name = "collnet_not_taken_when_an_algorithm_is_forced";
    if as_child(name, one_call) {
        return;
    }
    let lib = fixture("collnet_v9");
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_NET_PLUGIN", &lib),
            ("NCCL_COLLNET_ENABLE", "1"),
            ("NCCL_ALGO", "Ring"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "NET"),
        ],
        Duration::from_secs(120),
    );
    assert_all_ok(&done);
    for f in &done {
        assert_eq!(uses(f), 0, "rank {}:\n{}", f.rank, f.stderr);
        assert!(
            !f.stderr.contains("collnet-host: iallreduce"),
            "{}",
            f.stderr
        );
    }
}

/// A collnet vtable whose entries are NULL (the v8 fixture's) is refused
/// with one line saying why, and all_reduce runs on the rings.
#[test]
fn collnet_with_null_entries_is_refused_and_the_rings_run() {
    let name = "collnet_with_null_entries_is_refused_and_the_rings_run";
    if as_child(name, one_call) {
        return;
    }
    let lib = fixture("net_v8_nodev");
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_NET_PLUGIN", &lib),
            ("NCCL_COLLNET_ENABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
        Duration::from_secs(120),
    );
    assert_all_ok(&done);
    for f in &done {
        assert_eq!(uses(f), 0, "rank {}:\n{}", f.rank, f.stderr);
        let line = f
            .stderr
            .lines()
            .find(|l| l.contains("no CollNet"))
            .unwrap_or_else(|| panic!("rank {}: no reason given:\n{}", f.rank, f.stderr));
        assert!(
            line.contains("ncclCollNetPlugin_v8 in")
                && line.contains("NULL init, devices; not used"),
            "rank {}: {line}",
            f.rank
        );
        println!("rank {}: {line}", f.rank);
    }
}

/// The all-gathers and reduce-scatters each rank makes: (collective, type,
/// operation, bytes in all, in place). 3 MiB makes windows of the plugin's
/// 1 MiB that cross the nodes' blocks (1.5 MiB each); half precision is a
/// type the plugin does not reduce, so that reduce-scatter runs on the
/// rings (an all-gather moves bytes of any type).
const GATHERS: &[(Coll, DataType, RedOp, usize, bool)] = &[
    (Coll::AllGather, DataType::Float32, RedOp::Sum, 4096, false),
    (
        Coll::AllGather,
        DataType::Float64,
        RedOp::Sum,
        3 << 20,
        true,
    ),
    (Coll::AllGather, DataType::Float16, RedOp::Sum, 4096, false),
    (
        Coll::ReduceScatter,
        DataType::Float32,
        RedOp::Sum,
        4096,
        false,
    ),
    (
        Coll::ReduceScatter,
        DataType::Float64,
        RedOp::Max,
        3 << 20,
        true,
    ),
    (
        Coll::ReduceScatter,
        DataType::Int64,
        RedOp::Prod,
        4096,
        false,
    ),
    (Coll::ReduceScatter, DataType::Int32, RedOp::Min, 64, true),
    (
        Coll::ReduceScatter,
        DataType::Float16,
        RedOp::Sum,
        4096,
        false,
    ),
];

/// Calls of [`GATHERS`] the collnet carries, and the windows they make.
const GATHERS_THROUGH_COLLNET: u64 = 7;
const AG_WINDOWS: usize = 5;
const RS_WINDOWS: usize = 6;

/// A child rank of node `node(rank)`: runs [`GATHERS`] and prints how many
/// went through the CollNet.
fn gathers_body(node: fn(usize) -> usize) -> impl FnOnce(oxccl_tests::Rank) {
    move |r| {
        oxccl::log::init();
        let name = format!("collnet-node-{}", node(r.rank));
        let comm = r.comm(&[("HOSTID", &name)]);
        for &(coll, dtype, op, size, inplace) in GATHERS {
            let case = Case {
                coll,
                dtype,
                op,
                root: 0,
                size,
                inplace,
            };
            assert_eq!(case.check_once(&comm).unwrap(), 0, "{case:?}");
        }
        println!("COLLNET_USES {}", comm.collnet_uses());
        comm.destroy().unwrap();
    }
}

/// Lines of `f`'s log that say the plugin completed a `kind` call.
fn plugin_calls(f: &oxccl_cli::launch::Finished, kind: &str) -> usize {
    let pat = format!("collnet-host: {kind} #");
    f.stderr.lines().filter(|l| l.contains(&pat)).count()
}

/// Every rank ran [`GATHERS`] through the collnet as expected; the
/// leaders (`leader(rank)`) saw every window in the plugin.
fn assert_gathers_through_collnet(done: &[oxccl_cli::launch::Finished], leader: fn(usize) -> bool) {
    for f in done {
        assert_eq!(
            uses(f),
            GATHERS_THROUGH_COLLNET,
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
        let (ag, rs) = (
            plugin_calls(f, "iallgather"),
            plugin_calls(f, "ireducescatter"),
        );
        let want = if leader(f.rank) {
            (AG_WINDOWS, RS_WINDOWS)
        } else {
            (0, 0)
        };
        assert_eq!((ag, rs), want, "rank {}:\n{}", f.rank, f.stderr);
        assert!(
            f.stderr
                .contains("CollNet also runs all_gather and reduce_scatter"),
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
        println!(
            "rank {}: {} calls through CollNet, {ag} iallgather and {rs} ireducescatter windows on this rank",
            f.rank,
            uses(f)
        );
    }
}

#[test]
fn collnet_v9_gathers_two_nodes_of_one_rank() {
    let name = "collnet_v9_gathers_two_nodes_of_one_rank";
    if as_child(name, gathers_body(|r| r)) {
        return;
    }
    let done = run(name, 2, &fixture("collnet_v9"), "1");
    assert_gathers_through_collnet(&done, |_| true);
}

#[test]
fn collnet_v12_gathers_two_nodes_of_two_ranks() {
    let name = "collnet_v12_gathers_two_nodes_of_two_ranks";
    if as_child(name, gathers_body(|r| r / 2)) {
        return;
    }
    let done = run(name, 4, &fixture("collnet_v12"), "1");
    assert_gathers_through_collnet(&done, |r| r % 2 == 0);
}

/// Ranks 0 and 2 on one node, 1 and 3 on the other: the node-ordered
/// blocks are staged and put in rank order.
#[test]
fn collnet_v12_gathers_ranks_not_node_by_node() {
    let name = "collnet_v12_gathers_ranks_not_node_by_node";
    if as_child(name, gathers_body(|r| r % 2)) {
        return;
    }
    let done = run(name, 4, &fixture("collnet_v12"), "1");
    assert_gathers_through_collnet(&done, |r| r < 2);
    for f in &done {
        assert!(f.stderr.contains("staged in host memory"), "{}", f.stderr);
    }
}

/// A plugin without `iallgather` and `ireducescatter` (NULL): both run on
/// the rings, correct, with one INFO line saying why; all-reduce still
/// takes the collnet.
#[test]
fn collnet_without_gathers_runs_them_on_the_rings() {
    let name = "collnet_without_gathers_runs_them_on_the_rings";
    if as_child(name, |r| {
        gathers_body(|r| r)(r);
    }) {
        return;
    }
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_NET_PLUGIN", &fixture("collnet_v12_allreduce_only")),
            ("NCCL_COLLNET_ENABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
        Duration::from_secs(120),
    );
    assert_all_ok(&done);
    for f in &done {
        assert_eq!(uses(f), 0, "rank {}:\n{}", f.rank, f.stderr);
        let line = f
            .stderr
            .lines()
            .find(|l| l.contains("through rings and trees, not CollNet"))
            .unwrap_or_else(|| panic!("rank {}: no reason given:\n{}", f.rank, f.stderr));
        assert!(
            line.contains("all_gather and reduce_scatter")
                && line.contains("has no iallgather or ireducescatter"),
            "rank {}: {line}",
            f.rank
        );
        assert_eq!(
            plugin_calls(f, "iallgather") + plugin_calls(f, "ireducescatter"),
            0
        );
        println!("rank {}: {line}", f.rank);
    }
}
