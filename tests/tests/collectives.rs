//! Every collective on host memory over the socket network, as processes
//! on loopback: a sample of datatypes and ops, in and out of place, counts
//! 0, 1, a prime and several slices long, on 1 to 8 ranks, each output
//! checked element by element against a reference.

use oxccl::{DataType, RedOp};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::{as_child, assert_all_ok, run, spawn, took_direct_path, Rank};

const OPS: [RedOp; 6] = RedOp::ALL;
const TYPES: [DataType; 12] = DataType::ALL;

/// (datatype, op) pairs: every op on float32, and each other type with a
/// rotating op, so every type and every op is covered.
fn samples(coll: Coll) -> Vec<(DataType, RedOp)> {
    if !coll.reduces() {
        return vec![
            (DataType::Float32, RedOp::Sum),
            (DataType::Float16, RedOp::Sum),
            (DataType::Int8, RedOp::Sum),
            (DataType::Float64, RedOp::Sum),
        ];
    }
    let mut v: Vec<_> = OPS.iter().map(|&o| (DataType::Float32, o)).collect();
    v.extend(
        TYPES
            .iter()
            .filter(|&&t| t != DataType::Float32)
            .enumerate()
            .map(|(i, &t)| (t, OPS[i % OPS.len()])),
    );
    v
}

fn exercise(r: Rank, settings: &[(&str, &str)], counts: &[usize]) {
    let comm = r.comm(settings);
    let n = comm.count();
    let mut failures = Vec::new();
    for coll in Coll::ALL {
        for (dtype, op) in samples(coll) {
            for &count in counts {
                for inplace in [false, true] {
                    // Per-rank count in NCCL's sense; size is the larger buffer.
                    let total = match coll {
                        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => count * n,
                        _ => count,
                    };
                    let root = (count + 1) % n;
                    let case = Case {
                        coll,
                        dtype,
                        op,
                        root,
                        size: total * dtype.size(),
                        inplace,
                    };
                    if !case.exists() {
                        continue;
                    }
                    let wrong = case
                        .check_once(&comm)
                        .unwrap_or_else(|e| panic!("{case:?} on rank {}: {e}", r.rank));
                    if wrong != 0 {
                        failures.push(format!("{case:?}: {wrong} wrong"));
                    }
                }
            }
        }
    }
    comm.destroy().unwrap();
    assert!(
        failures.is_empty(),
        "rank {}: {} failures:\n{}",
        r.rank,
        failures.len(),
        failures.join("\n")
    );
}

/// Small slices so that the larger counts take many pipelined slices and two channels.
const SMALL_SLICES: &[(&str, &str)] = &[
    ("CHUNK_SIZE", "4K"),
    ("MIN_NCHANNELS", "2"),
    ("MAX_NCHANNELS", "2"),
];
const COUNTS: &[usize] = &[0, 1, 1009, 5003];

#[test]
fn collectives_1_rank() {
    run("collectives_1_rank", 1, |r| {
        exercise(r, SMALL_SLICES, COUNTS)
    });
}

#[test]
fn collectives_2_ranks() {
    run("collectives_2_ranks", 2, |r| {
        exercise(r, SMALL_SLICES, COUNTS)
    });
}

#[test]
fn collectives_3_ranks() {
    run("collectives_3_ranks", 3, |r| {
        exercise(r, SMALL_SLICES, COUNTS)
    });
}

#[test]
fn collectives_4_ranks() {
    run("collectives_4_ranks", 4, |r| exercise(r, &[], COUNTS));
}

#[test]
fn collectives_5_ranks_ring_forced() {
    run("collectives_5_ranks_ring_forced", 5, |r| {
        exercise(r, &[("ALGO", "Ring"), ("CHUNK_SIZE", "8K")], COUNTS)
    });
}

#[test]
fn collectives_6_ranks_doubling_forced() {
    run("collectives_6_ranks_doubling_forced", 6, |r| {
        exercise(r, &[("ALGO", "RecDoubling")], &[1, 1009])
    });
}

/// NCCL_ALGO=Tree admits the tree row: recursive doubling for the small
/// counts, the double binary tree (both trees, one per channel) for the
/// large one, as the model prices them on 7 ranks.
#[test]
fn collectives_7_ranks_tree_forced() {
    run("collectives_7_ranks_tree_forced", 7, |r| {
        exercise(
            r,
            &[("ALGO", "Tree"), ("CHUNK_SIZE", "32K")],
            &[1, 1009, 200_003],
        )
    });
}

#[test]
fn collectives_8_ranks() {
    run("collectives_8_ranks", 8, |r| {
        exercise(r, &[("CHUNK_SIZE", "16K")], &[0, 1, 1009, 5003])
    });
}

/// The direct host path (each rank reads its peers' buffers in place) on
/// every collective it takes, from the first byte, on several threads
/// (counts of several 64 KiB reduction chunks included). Where the kernel
/// refuses cross-process reads, the log says so and the rings ran instead.
/// `more` adds settings.
fn direct(
    name: &str,
    n: usize,
    threads: &str,
    p2p_max: &str,
    counts: &'static [usize],
    more: &[(&str, &str)],
) {
    let child = |r| {
        oxccl::log::init();
        exercise(r, &[], counts)
    };
    if as_child(name, child) {
        return;
    }
    let mut env = vec![
        ("OXCCL_HOST_DIRECT_MIN", "1"),
        ("OXCCL_HOST_DIRECT_THREADS", threads),
        ("OXCCL_HOST_DIRECT_P2P_MAX", p2p_max),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT"),
    ];
    env.extend_from_slice(more);
    let done = spawn(name, n, &env, std::time::Duration::from_secs(240));
    assert_all_ok(&done);
    for f in &done {
        took_direct_path(f);
    }
}

#[test]
fn collectives_3_ranks_direct() {
    direct(
        "collectives_3_ranks_direct",
        3,
        "2",
        "1M",
        &[1, 1009, 70_001],
        &[],
    );
}

/// Point-to-point messages above 4 KiB on the rings, numbered through the
/// mailboxes with the small ones (all_to_all's 5003 floats to each peer).
#[test]
fn collectives_5_ranks_direct() {
    direct("collectives_5_ranks_direct", 5, "4", "4K", &[1, 5003], &[]);
}

/// The all-reduce in 128 KiB slices and every read of 64 KiB or more
/// through scratch and streaming stores, as both are taken by default only
/// on large hosts: 1M floats give 1 MiB parts, 8 slices each, and reads of
/// 64 KiB per thread.
#[test]
fn collectives_4_ranks_direct_sliced_and_streamed() {
    direct(
        "collectives_4_ranks_direct_sliced_and_streamed",
        4,
        "2",
        "1M",
        &[1, 1009, 1_000_003],
        &[
            ("OXCCL_HOST_DIRECT_SLICE", "128K"),
            ("OXCCL_HOST_DIRECT_STREAM", "1"),
        ],
    );
}
