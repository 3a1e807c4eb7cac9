//! Bad arguments are refused with a message naming the argument and touch
//! nothing; a dead rank, a hung rank or mismatched calls end in an error on
//! every other rank within a bounded time, naming the ranks and the
//! operation.

use std::time::{Duration, Instant};

use oxccl::{Comm, CommConfig, DataType, Op, OpKind, RedOp};
use oxccl_tests::{as_child, spawn, took_direct_path};

fn comms(n: usize) -> Vec<Comm> {
    Comm::init_all(
        n,
        &CommConfig::default()
            .with("SOCKET_IFNAME", "lo")
            .with("TIMEOUT", "20"),
    )
    .unwrap()
}

fn enqueue_err(c: &Comm, op: Op) -> String {
    // SAFETY: the test passes valid buffers or null ones that validation refuses.
    unsafe { c.enqueue(op) }.unwrap_err().to_string()
}

#[test]
fn bad_arguments_are_named_and_touch_nothing() {
    let cs = comms(1);
    let c = &cs[0];
    let mut out = vec![0xabu8; 64];
    let base = Op {
        kind: OpKind::AllReduce,
        input: out.as_ptr(),
        output: out.as_mut_ptr(),
        count: 4,
        dtype: DataType::Float32,
        redop: RedOp::Sum,
        stream: 0,
        user_tag: 0,
        call: Default::default(),
    };
    let e = enqueue_err(
        c,
        Op {
            input: std::ptr::null(),
            ..base
        },
    );
    assert!(e.contains("sendbuff is null"), "{e}");
    let e = enqueue_err(
        c,
        Op {
            output: std::ptr::null_mut(),
            ..base
        },
    );
    assert!(e.contains("recvbuff is null"), "{e}");
    let e = enqueue_err(
        c,
        Op {
            kind: OpKind::Broadcast { root: 3 },
            ..base
        },
    );
    assert!(e.contains("root 3"), "{e}");
    let e = enqueue_err(
        c,
        Op {
            kind: OpKind::Send { peer: 9 },
            ..base
        },
    );
    assert!(e.contains("peer 9"), "{e}");
    let e = enqueue_err(
        c,
        Op {
            count: usize::MAX / 2,
            ..base
        },
    );
    assert!(e.contains("overflow"), "{e}");
    assert!(DataType::from_raw(12)
        .unwrap_err()
        .to_string()
        .contains("datatype 12"));
    assert!(RedOp::from_raw(7).unwrap_err().to_string().contains("op 7"));
    assert!(DataType::parse("float17")
        .unwrap_err()
        .to_string()
        .contains("float17"));
    // Count 0 with null buffers is legal and does nothing.
    // SAFETY: count 0 touches no memory.
    unsafe {
        c.enqueue(Op {
            count: 0,
            input: std::ptr::null(),
            output: std::ptr::null_mut(),
            ..base
        })
    }
    .unwrap();
    let mut small = vec![0u8; 6];
    let e = c
        .all_reduce(None, &mut small, DataType::Float32, RedOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 bytes"), "{e}");
    assert_eq!(out, vec![0xabu8; 64], "a refused call touched a buffer");
    let e = Comm::init_rank(2, Comm::unique_id().unwrap(), 2, &CommConfig::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 2"), "{e}");
    let e = CommConfig::default().with("SOCKET_IFNAME", "nosuchif0");
    let e = Comm::init_rank(1, Comm::unique_id().unwrap(), 0, &e)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("NCCL_SOCKET_IFNAME") && e.contains("nosuchif0"),
        "{e}"
    );
}

/// Runs `name` on `n` ranks with a short timeout, returning each rank's stderr.
fn fault_run(name: &str, n: usize) -> Vec<oxccl_cli::launch::Finished> {
    let start = Instant::now();
    let done = spawn(name, n, &[("NCCL_TIMEOUT", "4")], Duration::from_secs(60));
    assert!(
        start.elapsed() < Duration::from_secs(40),
        "took {:?}",
        start.elapsed()
    );
    done
}

/// Every surviving rank exits 0 after asserting its own error.
fn survivors_ok(done: &[oxccl_cli::launch::Finished], dead: usize) {
    for f in done.iter().filter(|f| f.rank != dead) {
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

fn expect_error(comm: &Comm, what: &[&str]) {
    let start = Instant::now();
    let mut b = vec![0u8; 4096];
    let e = comm
        .all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
        .unwrap_err()
        .to_string();
    eprintln!("error after {:?}: {e}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "error came after {:?}",
        start.elapsed()
    );
    for w in what {
        assert!(e.contains(w), "error {e:?} lacks {w:?}");
    }
}

#[test]
fn dead_rank_is_named_on_every_other_rank() {
    let name = "dead_rank_is_named_on_every_other_rank";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let mut b = vec![0u8; 4096];
        comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap();
        if r.rank == 2 {
            std::process::exit(3);
        }
        expect_error(&comm, &["rank", "#1"]);
    }) {
        return;
    }
    let done = fault_run(name, 4);
    survivors_ok(&done, 2);
    for f in done.iter().filter(|f| f.rank != 2) {
        assert!(
            f.stderr.contains("rank 2")
                || f.stderr.contains("ranks not answering (dead or hung): 2"),
            "rank {} does not name rank 2:\n{}",
            f.rank,
            f.stderr
        );
    }
}

#[test]
fn hung_rank_is_named_as_never_arrived() {
    let name = "hung_rank_is_named_as_never_arrived";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let mut b = vec![0u8; 64];
        comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap();
        if r.rank == 1 {
            // Alive but never calls the second collective.
            std::thread::sleep(Duration::from_secs(12));
            return;
        }
        expect_error(&comm, &["#1", "never arrived", "1 (started 1"]);
    }) {
        return;
    }
    let done = fault_run(name, 3);
    survivors_ok(&done, 1);
}

#[test]
fn mismatched_counts_fail_on_every_rank() {
    let name = "mismatched_counts_fail_on_every_rank";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let count = if r.rank == 1 { 200 } else { 100 };
        let mut b = vec![0u8; count * 4];
        let e = comm
            .all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap_err()
            .to_string();
        eprintln!("rank {}: {e}", r.rank);
        assert!(e.contains("200 x float") || e.contains("failed"), "{e}");
    }) {
        return;
    }
    let done = fault_run(name, 3);
    survivors_ok(&done, usize::MAX);
}

#[test]
fn different_collectives_fail_on_every_rank() {
    let name = "different_collectives_fail_on_every_rank";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let mut b = vec![0u8; 64 * 3];
        let e = if r.rank == 0 {
            comm.all_gather(None, &mut b, DataType::Float32)
        } else {
            comm.all_reduce(None, &mut b[..64], DataType::Float32, RedOp::Sum)
        };
        let e = e.unwrap_err().to_string();
        eprintln!("rank {}: {e}", r.rank);
        assert!(e.contains("all_gather") || e.contains("failed"), "{e}");
    }) {
        return;
    }
    let done = fault_run(name, 3);
    survivors_ok(&done, usize::MAX);
}

/// Point-to-point messages between processes of one host go through the
/// peer-memory mailboxes: a receiver that dies before taking its message
/// is named by the sender at once (its process is gone), and the
/// sender's failure reaches a third rank waiting on a message from it.
#[test]
fn a_dead_or_silent_peer_of_a_send_is_named() {
    let name = "a_dead_or_silent_peer_of_a_send_is_named";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        // One exchange first: every process is up and connected.
        let mut b = vec![0u8; 4096];
        comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap();
        let start = Instant::now();
        let out = vec![1u8; 1000];
        let mut inp = vec![0u8; 1000];
        let e = match r.rank {
            // Dies instead of receiving from rank 0.
            1 => std::process::exit(3),
            0 => {
                let mut g = oxccl::Group::new();
                g.send(&comm, &out, DataType::Uint8, 1).unwrap();
                g.run().unwrap_err().to_string()
            }
            // Rank 0 fails before sending to rank 2.
            _ => {
                let mut g = oxccl::Group::new();
                g.recv(&comm, &mut inp, DataType::Uint8, 0).unwrap();
                g.run().unwrap_err().to_string()
            }
        };
        eprintln!("error after {:?}: {e}", start.elapsed());
        assert!(start.elapsed() < Duration::from_secs(15), "{e}");
        let who = if r.rank == 0 { "rank 1" } else { "rank 0" };
        assert!(e.contains(who) || e.contains("rank 1"), "{e}");
        assert!(inp.iter().all(|&x| x == 0));
    }) {
        return;
    }
    let done = fault_run(name, 3);
    survivors_ok(&done, 1);
    for f in done.iter().filter(|f| f.rank != 1) {
        eprintln!("rank {}: {}", f.rank, f.stderr.trim());
    }
}

/// A receiver that is alive but never posts its receive holds the send
/// until NCCL_TIMEOUT, which then names it: the mailbox wait is bounded.
#[test]
fn a_silent_receiver_of_a_send_is_named_at_the_timeout() {
    let name = "a_silent_receiver_of_a_send_is_named_at_the_timeout";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let mut b = vec![0u8; 4096];
        comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap();
        if r.rank == 1 {
            // Alive, but never receives.
            std::thread::sleep(Duration::from_secs(8));
            return;
        }
        let start = Instant::now();
        let out = vec![1u8; 1000];
        let mut g = oxccl::Group::new();
        g.send(&comm, &out, DataType::Uint8, 1).unwrap();
        let e = g.run().unwrap_err().to_string();
        eprintln!("error after {:?}: {e}", start.elapsed());
        assert!(start.elapsed() < Duration::from_secs(15), "{e}");
        assert!(e.contains("[1]") && e.contains("mailbox"), "{e}");
    }) {
        return;
    }
    let done = fault_run(name, 2);
    survivors_ok(&done, 1);
    eprintln!("rank 0: {}", done[0].stderr.trim());
}

/// An in-place all-reduce of `count` floats that every one of 2 ranks
/// starts from the same values: what it returned, and how many elements
/// are not twice their start.
fn summed_on_2_ranks(comm: &Comm, count: usize) -> (oxccl::Result<()>, usize) {
    let x: Vec<f32> = (0..count).map(|i| (i % 97) as f32).collect();
    let mut b: Vec<u8> = x.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let got = comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum);
    let wrong = b
        .chunks_exact(4)
        .zip(&x)
        .filter(|(g, v)| f32::from_ne_bytes((*g).try_into().unwrap()) != 2.0 * **v)
        .count();
    (got, wrong)
}

/// 2 ranks whose `var` differs (rank 1 has `other`), on the direct host
/// path or (`direct` false) on the rings: both take rank 0's setting, rank
/// 1 says so in a warning naming the variable, and an all-reduce of 100
/// 000 floats is right on both. Before the ranks agreed, different slices
/// finished at once with no error, different direct-path thresholds or
/// minimum channels waited for each other until NCCL_TIMEOUT, and
/// different chunk sizes failed with a truncated message.
fn setting_differs(name: &str, var: &str, mine: &str, other: &str, direct: bool) {
    if as_child(name, |r| {
        // The child is single-threaded until its communicator starts, below.
        std::env::set_var(var, if r.rank == 1 { other } else { mine });
        oxccl::log::init();
        let comm = r.comm(&[]);
        let start = Instant::now();
        let (got, wrong) = summed_on_2_ranks(&comm, 100_000);
        got.unwrap();
        eprintln!("rank {}: {wrong} wrong after {:?}", r.rank, start.elapsed());
        assert_eq!(wrong, 0, "rank {}", r.rank);
        comm.destroy().unwrap();
    }) {
        return;
    }
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_TIMEOUT", "8"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT"),
            ("OXCCL_HOST_DIRECT_THREADS", "1"),
            ("OXCCL_HOST_DIRECT", if direct { "1" } else { "0" }),
        ],
        Duration::from_secs(60),
    );
    survivors_ok(&done, usize::MAX);
    for f in &done {
        if direct && !took_direct_path(f) {
            return;
        }
        let log = format!("{}{}", f.stdout, f.stderr);
        let warned = log
            .lines()
            .find(|l| l.contains(&format!("{var}: {other} here")));
        assert_eq!(warned.is_some(), f.rank == 1, "rank {}:\n{log}", f.rank);
        if let Some(w) = warned {
            eprintln!("rank {}: {w}", f.rank);
        }
    }
}

#[test]
fn direct_slices_that_differ_take_rank_0s() {
    setting_differs(
        "direct_slices_that_differ_take_rank_0s",
        "OXCCL_HOST_DIRECT_SLICE",
        "65536",
        "0",
        true,
    );
}

#[test]
fn direct_thresholds_that_differ_take_rank_0s() {
    setting_differs(
        "direct_thresholds_that_differ_take_rank_0s",
        "OXCCL_HOST_DIRECT_MIN",
        "1",
        "1073741824",
        true,
    );
}

#[test]
fn chunk_sizes_that_differ_take_rank_0s() {
    setting_differs(
        "chunk_sizes_that_differ_take_rank_0s",
        "NCCL_CHUNK_SIZE",
        "131072",
        "1048576",
        false,
    );
}

#[test]
fn minimum_channels_that_differ_take_rank_0s() {
    setting_differs(
        "minimum_channels_that_differ_take_rank_0s",
        "NCCL_MIN_NCHANNELS",
        "1",
        "4",
        false,
    );
}

/// 2 ranks on host memory, each set up by `setup(rank)` before its
/// communicator starts; all-reduces of 2, 1000 and 300 000 floats (the
/// last one past the direct path's threshold). Each rank prints what each
/// call gave, for the caller to assert on.
fn calls_on_2_ranks(name: &str, setup: impl FnOnce(usize)) -> Vec<oxccl_cli::launch::Finished> {
    if as_child(name, |r| {
        setup(r.rank);
        oxccl::log::init();
        let comm = r.comm(&[]);
        for count in [2usize, 1000, 300_000] {
            let start = Instant::now();
            let (got, wrong) = summed_on_2_ranks(&comm, count);
            let took = start.elapsed();
            assert!(took < Duration::from_secs(3), "count {count}: {took:?}");
            match got {
                Ok(()) => eprintln!("count {count}: ok, {wrong} wrong"),
                Err(e) => {
                    eprintln!("count {count}: error: {e}");
                    return;
                }
            }
        }
    }) {
        return Vec::new();
    }
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_TIMEOUT", "8"),
            ("NCCL_DEBUG", "WARN"),
            ("OXCCL_HOST_DIRECT_THREADS", "1"),
        ],
        Duration::from_secs(60),
    );
    survivors_ok(&done, usize::MAX);
    done
}

/// Every call of [`calls_on_2_ranks`] was right on every rank, and each
/// of `said` is in every rank's log.
fn all_right_and_said(done: &[oxccl_cli::launch::Finished], said: &[&str]) {
    for f in done {
        for count in [2, 1000, 300_000] {
            assert!(
                f.stderr.contains(&format!("count {count}: ok, 0 wrong")),
                "rank {}:\n{}",
                f.rank,
                f.stderr
            );
        }
        for s in said {
            let line = f.stderr.lines().find(|l| l.contains(s));
            assert!(line.is_some(), "rank {}: no {s:?} in\n{}", f.rank, f.stderr);
            eprintln!("rank {}: {}", f.rank, line.unwrap_or_default());
        }
    }
}

/// 2 ranks on host memory, rank 1 with NCCL_ALGO=`b`, rank 0 with `a`
/// (None: unset).
fn algo_differs(name: &str, a: Option<&str>, b: &str) -> Vec<oxccl_cli::launch::Finished> {
    calls_on_2_ranks(name, |rank| {
        // The child is single-threaded until its communicator starts.
        match (rank, a) {
            (1, _) => std::env::set_var("NCCL_ALGO", b),
            (_, Some(a)) => std::env::set_var("NCCL_ALGO", a),
            (_, None) => std::env::remove_var("NCCL_ALGO"),
        }
    })
}

/// A rank whose NCCL_ALGO differs from rank 0's takes rank 0's and warns,
/// naming both; every call is right. Before, a rank forcing Tree alone
/// went onto the rings where the others read peers' buffers directly, and
/// both waited until NCCL_TIMEOUT; ranks forcing Ring and Tree failed with
/// "rank 1 sent 40 bytes where 36 were expected"; and on the device path,
/// whose steps carry no header, Ring on rank 1 alone gave wrong results and
/// then a failed kernel launch.
fn algo_takes_rank_0s(name: &str, first: Option<&str>) {
    let done = algo_differs(name, first, "Tree");
    let said = format!(
        "NCCL_ALGO: Tree here, {} on rank 0",
        first.unwrap_or("unset")
    );
    all_right_and_said(&done, &[]);
    for f in &done {
        assert_eq!(
            f.stderr.contains(&said),
            f.rank == 1,
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
    }
}

#[test]
fn an_algorithm_forced_on_one_rank_gives_way_to_rank_0s() {
    algo_takes_rank_0s("an_algorithm_forced_on_one_rank_gives_way_to_rank_0s", None);
}

#[test]
fn ranks_forcing_different_algorithms_take_rank_0s() {
    algo_takes_rank_0s(
        "ranks_forcing_different_algorithms_take_rank_0s",
        Some("Ring"),
    );
}

/// What every rank says when the ranks' tuners cannot be followed.
const NO_TUNER: &str = "Every rank runs without its tuner";

/// A tuner plugin loaded on one rank of two is left off on both, and both
/// say why; every call is right. Before, rank 1 ran the ring its tuner
/// chose where rank 0 ran recursive doubling, and both failed their first
/// call with "mismatched algorithms"; on the device path, whose steps carry
/// no header, ranks choosing apart gave wrong results (as NCCL_ALGO on one
/// rank did at 94edbd1, 2026-11-27).
#[test]
fn a_tuner_on_one_rank_only_is_left_off_on_every_rank() {
    let name = "a_tuner_on_one_rank_only_is_left_off_on_every_rank";
    let done = calls_on_2_ranks(name, |rank| {
        let lib = format!("{}/libtuner_ring.so", env!("OXCCL_FIXTURES"));
        std::env::set_var("NCCL_TUNER_PLUGIN", if rank == 1 { &lib } else { "none" });
    });
    let said = "ranks [1] have a tuner plugin and ranks [0] none";
    all_right_and_said(&done, &[said, NO_TUNER]);
}

/// The same tuner library on both ranks with a rules file on rank 0 only:
/// their choices differ from the first question on, and both ranks name it
/// and leave the tuner off; every call is right.
#[test]
fn tuners_configured_apart_are_left_off_on_every_rank() {
    let name = "tuners_configured_apart_are_left_off_on_every_rank";
    let done = calls_on_2_ranks(name, |rank| {
        let lib = oxccl_tests::built_library("liboxccl_tuner.so")
            .expect("liboxccl_tuner.so next to the test binary (a dev-dependency builds it)");
        std::env::set_var("NCCL_TUNER_PLUGIN", lib);
        std::env::remove_var("NCCL_TUNER_CONFIG_FILE");
        if rank == 0 {
            let rules =
                std::env::temp_dir().join(format!("oxccl-{name}-{}.toml", std::process::id()));
            std::fs::write(
                &rules,
                "[[rule]]\ncollective = \"all_reduce\"\nalgorithm = \"ring\"\nprotocol = \"simple\"\n",
            )
            .unwrap();
            std::env::set_var("OXCCL_TUNER_CONFIG", &rules);
        } else {
            std::env::remove_var("OXCCL_TUNER_CONFIG");
        }
    });
    for f in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if f.file_name()
            .to_string_lossy()
            .starts_with(&format!("oxccl-{name}-"))
        {
            let _ = std::fs::remove_file(f.path());
        }
    }
    let said = "rank 1's tuner chooses tree/ll on 1 channel(s) for all_reduce of 8 B, rank 0's ring/simple on 1 channel(s)";
    all_right_and_said(&done, &[said, NO_TUNER]);
}

/// 2 ranks on host memory whose all-reduce counts differ (rank 0 `a`
/// floats, rank 1 `b`) where the two fall on different paths (inline up
/// to 4 KiB, the rings, the direct path's threads from 512 KiB): both
/// ranks name the mismatch, with both counts, within a few seconds, long
/// before NCCL_TIMEOUT (30 s here). Before, each rank took the path of
/// its own count, so they never met to compare headers: both waited the
/// whole NCCL_TIMEOUT and then failed with "ranks=none".
fn counts_on_two_paths(name: &str, a: usize, b: usize) {
    if as_child(name, |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        // One call that agrees first: the ranks are then in step.
        summed_on_2_ranks(&comm, 4).0.unwrap();
        let count = if r.rank == 0 { a } else { b };
        let start = Instant::now();
        let e = summed_on_2_ranks(&comm, count).0.unwrap_err().to_string();
        let took = start.elapsed();
        eprintln!("rank {} after {took:?}: {e}", r.rank);
        assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
        for said in [
            "mismatched counts".to_string(),
            format!("all_reduce #1 of {a} x float"),
            format!("of {b} x float"),
        ] {
            assert!(e.contains(&said), "rank {}: no {said:?} in {e}", r.rank);
        }
    }) {
        return;
    }
    let start = Instant::now();
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_TIMEOUT", "30"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT"),
            // The thresholds this test crosses, whatever the host's cores.
            ("OXCCL_HOST_DIRECT_MIN", "512K"),
        ],
        Duration::from_secs(90),
    );
    eprintln!("{name}: both ranks done after {:?}", start.elapsed());
    survivors_ok(&done, usize::MAX);
    for f in &done {
        took_direct_path(f);
    }
}

#[test]
fn counts_inline_and_on_the_rings_are_named() {
    counts_on_two_paths("counts_inline_and_on_the_rings_are_named", 1024, 2048);
}

#[test]
fn counts_one_element_across_the_inline_size_are_named() {
    counts_on_two_paths(
        "counts_one_element_across_the_inline_size_are_named",
        1024,
        1025,
    );
}

#[test]
fn counts_on_the_rings_and_on_threads_are_named() {
    counts_on_two_paths(
        "counts_on_the_rings_and_on_threads_are_named",
        65536,
        262_144,
    );
}

#[test]
fn counts_inline_and_on_threads_are_named() {
    counts_on_two_paths("counts_inline_and_on_threads_are_named", 1024, 262_144);
}
