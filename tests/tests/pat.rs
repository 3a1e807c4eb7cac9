//! PAT's all-gather and reduce-scatter (NCCL_ALGO=PAT) as processes on
//! loopback, host memory: 2, 3, 5, 8 and 16 ranks, each output checked
//! element by element against a reference on random data; whole blocks
//! on one channel, and parts of blocks on two channels in small slices.
//! Every count from 2 to 64 (and 1,024) is checked by the simulator
//! (core/src/algo/sim.rs). And the choice: ranks that are hosts of their
//! own take PAT for small calls unasked, and never under NCCL_ALGO=^PAT.

use oxccl::{DataType, RedOp};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::{as_child, assert_all_ok, run, spawn, Rank};

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

/// (datatype, op) pairs of the reduce-scatter: every op on float32, and
/// each other type with a rotating op (as tests/collectives.rs).
fn samples() -> Vec<(DataType, RedOp)> {
    let mut v: Vec<_> = RedOp::ALL.iter().map(|&o| (DataType::Float32, o)).collect();
    v.extend(
        DataType::ALL
            .iter()
            .filter(|&&t| t != DataType::Float32)
            .enumerate()
            .map(|(i, &t)| (t, RedOp::ALL[i % RedOp::ALL.len()])),
    );
    v
}

/// The reduce-scatter under three shapes: two channels in 4 KiB slices
/// (parts of blocks, a step per block); one channel in 64-byte slices
/// (blocks past what the executor opens whole: a step per block, many
/// slices each; tiny blocks joined); one channel in 1 MiB slices (whole
/// blocks joined into one step per run).
fn exercise_rs(r: Rank) {
    let mut failures = Vec::new();
    let shapes: [&[(&str, &str)]; 3] = [
        &[
            ("ALGO", "PAT"),
            ("CHUNK_SIZE", "4K"),
            ("MIN_NCHANNELS", "2"),
            ("MAX_NCHANNELS", "2"),
        ],
        &[
            ("ALGO", "PAT"),
            ("CHUNK_SIZE", "64"),
            ("MAX_NCHANNELS", "1"),
        ],
        &[
            ("ALGO", "PAT"),
            ("CHUNK_SIZE", "1M"),
            ("MAX_NCHANNELS", "1"),
        ],
    ];
    // One unique id makes one communicator: the shapes are splits of it.
    let base = r.comm(&[]);
    for settings in shapes {
        let mut cfg = oxccl::CommConfig::default();
        for (k, v) in settings {
            cfg = cfg.with(k, v);
        }
        let comm = base
            .split(0, r.rank as i32, &cfg)
            .expect("split")
            .expect("every rank is in color 0");
        let n = comm.count();
        for (dtype, op) in samples() {
            let counts: &[usize] = if (dtype, op) == (DataType::Float32, RedOp::Sum) {
                &[1, 1009, 5003]
            } else {
                &[1, 1009]
            };
            for &count in counts {
                for inplace in [false, true] {
                    let case = Case {
                        coll: Coll::ReduceScatter,
                        dtype,
                        op,
                        root: 0,
                        size: count * n * dtype.size(),
                        inplace,
                    };
                    if !case.exists() {
                        continue;
                    }
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
    base.destroy().unwrap();
    assert!(
        failures.is_empty(),
        "rank {}: {}",
        r.rank,
        failures.join("\n")
    );
}

#[test]
fn pat_reduce_scatter_2_ranks() {
    run("pat_reduce_scatter_2_ranks", 2, exercise_rs);
}

#[test]
fn pat_reduce_scatter_3_ranks() {
    run("pat_reduce_scatter_3_ranks", 3, exercise_rs);
}

#[test]
fn pat_reduce_scatter_5_ranks() {
    run("pat_reduce_scatter_5_ranks", 5, exercise_rs);
}

#[test]
fn pat_reduce_scatter_8_ranks() {
    run("pat_reduce_scatter_8_ranks", 8, exercise_rs);
}

#[test]
fn pat_reduce_scatter_16_ranks() {
    run("pat_reduce_scatter_16_ranks", 16, exercise_rs);
}

/// Runs a small all-gather and reduce-scatter (checked) on `n` ranks, each
/// a host of its own (NCCL_HOSTID), with NCCL_ALGO=`algo` (unset: ""),
/// and returns how many of each rank's collectives ran PAT and the ring,
/// from the COLL log.
fn choices(name: &str, n: usize, algo: &str) -> Vec<(usize, usize)> {
    let child = |r: Rank| {
        oxccl::log::init();
        let host = format!("pat-host-{}", r.rank);
        let mut settings = vec![("HOSTID", host.as_str())];
        if !algo.is_empty() {
            settings.push(("ALGO", algo));
        }
        let comm = r.comm(&settings);
        let n = comm.count();
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            let case = Case {
                coll,
                dtype: DataType::Float32,
                op: RedOp::Sum,
                root: 0,
                size: 4 * n * DataType::Float32.size(),
                inplace: false,
            };
            assert_eq!(case.check_once(&comm).unwrap(), 0, "{case:?}");
        }
        comm.destroy().unwrap();
    };
    if as_child(name, child) {
        return Vec::new();
    }
    let env = [("NCCL_DEBUG", "TRACE"), ("NCCL_DEBUG_SUBSYS", "COLL")];
    let done = spawn(name, n, &env, std::time::Duration::from_secs(240));
    assert_all_ok(&done);
    done.iter()
        .map(|f| {
            let log = format!("{}{}", f.stdout, f.stderr);
            (
                log.matches(": PAT on ").count(),
                log.matches(": Ring on ").count(),
            )
        })
        .collect()
}

/// One rank per host: the model takes PAT for small all-gathers and
/// reduce-scatters, as NCCL does (src/tuning/pat.cc: nNodes == nRanks).
#[test]
fn pat_chosen_with_one_rank_per_host() {
    let got = choices("pat_chosen_with_one_rank_per_host", 8, "");
    if got.is_empty() {
        return;
    }
    assert!(got.iter().all(|&(pat, _)| pat >= 2), "{got:?}");
}

/// NCCL_ALGO=^PAT leaves PAT out, and the ring runs instead.
#[test]
fn pat_excluded_by_nccl_algo() {
    let got = choices("pat_excluded_by_nccl_algo", 8, "^PAT");
    if got.is_empty() {
        return;
    }
    assert!(
        got.iter().all(|&(pat, ring)| pat == 0 && ring >= 2),
        "{got:?}"
    );
}
