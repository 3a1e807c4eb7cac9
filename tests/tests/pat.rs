//! PAT's all-gather (NCCL_ALGO=PAT) as processes on loopback, host memory:
//! 2, 3, 5, 8 and 16 ranks, each output checked element by element
//! against a reference on random data; whole blocks on one channel, and
//! parts of blocks on two channels in small slices. Every count from 2 to
//! 64 (and 1,024) is checked by the simulator (core/src/algo/sim.rs).

use oxccl::{DataType, RedOp};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::{run, Rank};

fn exercise(r: Rank) {
    let mut failures = Vec::new();
    // Two channels: count 1 runs on one (whole blocks, a step per run of
    // blocks), the others on two (parts of blocks, a step per block).
    let settings = [
        ("ALGO", "PAT"),
        ("CHUNK_SIZE", "4K"),
        ("MIN_NCHANNELS", "2"),
        ("MAX_NCHANNELS", "2"),
    ];
    {
        let comm = r.comm(&settings);
        let n = comm.count();
        for dtype in [DataType::Float32, DataType::Int8, DataType::Float64] {
            for count in [1, 1009, 5003] {
                for inplace in [false, true] {
                    let case = Case {
                        coll: Coll::AllGather,
                        dtype,
                        op: RedOp::Sum,
                        root: 0,
                        size: count * n * dtype.size(),
                        inplace,
                    };
                    let wrong = case
                        .check_once(&comm)
                        .unwrap_or_else(|e| panic!("{case:?} on rank {}: {e}", r.rank));
                    if wrong != 0 {
                        failures.push(format!("{settings:?} {case:?}: {wrong} wrong"));
                    }
                }
            }
        }
        comm.destroy().unwrap();
    }
    assert!(
        failures.is_empty(),
        "rank {}: {}",
        r.rank,
        failures.join("\n")
    );
}

#[test]
fn pat_all_gather_2_ranks() {
    run("pat_all_gather_2_ranks", 2, exercise);
}

#[test]
fn pat_all_gather_3_ranks() {
    run("pat_all_gather_3_ranks", 3, exercise);
}

#[test]
fn pat_all_gather_5_ranks() {
    run("pat_all_gather_5_ranks", 5, exercise);
}

#[test]
fn pat_all_gather_8_ranks() {
    run("pat_all_gather_8_ranks", 8, exercise);
}

#[test]
fn pat_all_gather_16_ranks() {
    run("pat_all_gather_16_ranks", 16, exercise);
}
