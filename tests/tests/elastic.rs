//! Communicators that survive a dead rank: four processes run a stream of
//! all-reduces on random data; one is SIGKILLed (or SIGSTOPped) in the
//! middle of it; the three survivors see the error within NCCL_TIMEOUT,
//! drop that rank with a shrink (revoke then NCCL_SHRINK_DEFAULT through
//! shared memory, NCCL_SHRINK_ABORT alone through the socket network), and
//! run 100 more all-reduces and every collective, each output checked
//! against a reference. A SIGSTOPped rank is woken once the survivors have
//! shrunk it away: its interrupted 1 MiB all-reduce (the direct host path
//! between processes) must not write into the survivors' buffers, which
//! they reuse for 1 MiB all-reduces and reduces while it runs on. And a job
//! that grows from 2 processes to 4 and shrinks back, checked after each
//! change.

use std::time::{Duration, Instant};

use nix::sys::signal::{raise, Signal};
use oxccl::{Comm, CommConfig, DataType, InitState, RedOp, ShrinkMode, UniqueId, SPLIT_NOCOLOR};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::{as_child, checked_all_reduce, spawn, Rank};

/// The rank that dies: not the last, so that the survivors are renumbered.
const VICTIM: usize = 1;
/// Seconds a survivor may wait on the dead rank before failing.
const TIMEOUT_S: u64 = 4;
const ELEMS: usize = 16 << 10;
/// Float32 elements of the stream where the victim is stopped: 1 MiB, on
/// the direct host path (from 512 KiB), where the victim is most likely
/// stopped inside a phase that touches its peers' buffers.
const DIRECT_ELEMS: usize = 256 << 10;

/// Every collective once, in and out of place, on two datatypes.
fn every_collective(comm: &Comm) -> Vec<String> {
    let n = comm.count();
    let mut bad = Vec::new();
    for coll in Coll::ALL {
        for (dtype, op) in [
            (DataType::Float32, RedOp::Sum),
            (DataType::Int32, RedOp::Max),
        ] {
            for inplace in [false, true] {
                let count = 3001;
                let total = match coll {
                    Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => count * n,
                    _ => count,
                };
                let case = Case {
                    coll,
                    dtype,
                    op,
                    root: 1 % n,
                    size: total * dtype.size(),
                    inplace,
                };
                if !case.exists() {
                    continue;
                }
                match case.check_once(comm) {
                    Ok(0) => {}
                    Ok(w) => bad.push(format!("{case:?}: {w} wrong")),
                    Err(e) => bad.push(format!("{case:?}: {e}")),
                }
            }
        }
    }
    bad
}

/// How the victim leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL: gone for good.
    Kill,
    /// SIGSTOP: hung; the survivors SIGCONT it once they have shrunk it
    /// away, and its operation must then end in an error.
    Stop,
}

/// A rank's part: all-reduces until the victim dies (the victim's own
/// thread signals it in the middle of the stream), then recovery.
fn survive(r: Rank, mode: ShrinkMode, revoke_first: bool, fault: Fault) {
    let comm = r.comm(&[]);
    // Every rank's pid, so that the survivors can wake a stopped victim.
    let mut pids = vec![0u8; 4 * comm.count()];
    let off = 4 * r.rank;
    pids[off..off + 4].copy_from_slice(&std::process::id().to_le_bytes());
    comm.all_gather(None, &mut pids, DataType::Uint32).unwrap();
    let victim_pid = u32::from_le_bytes(pids[4 * VICTIM..4 * VICTIM + 4].try_into().unwrap());
    if r.rank == VICTIM {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = raise(match fault {
                Fault::Kill => Signal::SIGKILL,
                Fault::Stop => Signal::SIGSTOP,
            });
        });
    }
    let elems = match fault {
        Fault::Kill => ELEMS,
        Fault::Stop => DIRECT_ELEMS,
    };
    // The same buffer before and after the shrink: the parent's calls
    // posted its address to the victim.
    let mut buf = vec![0u8; elems * 4];
    let mut it = 0u64;
    let mut last_ok = Instant::now();
    let err = loop {
        match checked_all_reduce(&comm, it, &mut buf) {
            Ok(0) => {}
            Ok(w) => panic!("rank {}: all_reduce #{it}: {w} wrong elements", r.rank),
            Err(e) => break e,
        }
        it += 1;
        last_ok = Instant::now();
        assert!(it < 1_000_000, "rank {}: the victim never left", r.rank);
    };
    let detect = last_ok.elapsed();
    if r.rank == VICTIM {
        // Woken after the others shrank it away: an error, not wrong data.
        println!("VICTIM ERROR after {detect:?}: {err}");
        return;
    }
    eprintln!(
        "rank {}: after {it} all_reduces, failed in {detect:?}: {err}",
        r.rank
    );
    assert!(
        detect < Duration::from_secs(TIMEOUT_S + 5),
        "rank {}: the failure took {detect:?} to show",
        r.rank
    );
    assert!(
        matches!(err, oxccl::Error::Remote(_) | oxccl::Error::System(_)),
        "{err}"
    );
    if fault == Fault::Stop {
        // The rank that timed out asked every rank how far it got; the
        // stopped one could not answer, and every survivor hears its name.
        let e = err.to_string();
        assert!(e.contains("not answering (dead or hung): 1"), "{e}");
    }
    // The failure stays, for the application to see, with the ranks to
    // exclude: the same on every survivor (the parent compares them).
    assert!(comm.async_error().is_err());
    let failure = err
        .failure()
        .unwrap_or_else(|| panic!("rank {}: no failure record in: {err}", r.rank));
    assert_eq!(comm.failure().as_ref(), Some(&failure));
    assert_eq!(failure.ranks, [VICTIM], "rank {}: {err}", r.rank);
    assert_eq!(failure.op, "all_reduce");
    println!("EXCLUDE {}", failure.tag());
    let t = Instant::now();
    if revoke_first {
        assert_eq!(comm.revoke().unwrap(), InitState::Ready);
        assert_eq!(comm.async_error().unwrap(), InitState::Ready);
        assert!(comm.finalize().is_err());
    }
    // Kept through the revoke.
    assert_eq!(comm.failure(), Some(failure.clone()));
    let kid = comm
        .shrink(&failure.ranks, &CommConfig::default(), mode)
        .unwrap_or_else(|e| panic!("rank {}: shrink: {e}", r.rank));
    eprintln!(
        "rank {}: {mode:?} shrink (revoke first: {revoke_first}) in {:?}",
        r.rank,
        t.elapsed()
    );
    assert_eq!(kid.count(), 3);
    // Shrunk, the failed parent counts as revoked: its error is handled
    // (PyTorch's shrink_group checks it reads success, as NCCL's does), its
    // record stays, and it runs nothing more.
    assert_eq!(comm.async_error().unwrap(), InitState::Ready);
    assert_eq!(comm.failure(), Some(failure.clone()));
    let mut one = vec![0u8; 64];
    let refused = comm
        .all_reduce(None, &mut one, DataType::Float32, RedOp::Sum)
        .unwrap_err();
    assert!(refused.to_string().contains("revoked"), "{refused}");
    // Finalize: refused after the application's own revoke (NCCL's rule);
    // after a shrink alone there is nothing to wait for.
    assert_eq!(comm.finalize().is_ok(), !revoke_first);
    let want = if r.rank < VICTIM { r.rank } else { r.rank - 1 };
    assert_eq!(kid.user_rank(), want, "renumbering");
    if fault == Fault::Stop && kid.user_rank() == 0 {
        let pid = nix::unistd::Pid::from_raw(victim_pid as i32);
        nix::sys::signal::kill(pid, Signal::SIGCONT).expect("SIGCONT the victim");
    }
    for i in 0..100 {
        let w = checked_all_reduce(&kid, 1000 + i, &mut buf)
            .unwrap_or_else(|e| panic!("rank {}: all_reduce #{i} after shrink: {e}", r.rank));
        assert_eq!(w, 0, "rank {}: all_reduce #{i} after shrink", r.rank);
        if fault == Fault::Stop {
            // While the woken victim runs on: a reduce in the same buffer,
            // each root in turn; a non-root's buffer must keep its input.
            let case = Case {
                coll: Coll::Reduce,
                dtype: DataType::Float32,
                op: RedOp::Sum,
                root: i as usize % kid.count(),
                size: buf.len(),
                inplace: true,
            };
            let w = case
                .check_in(&kid, &mut [], &mut buf)
                .unwrap_or_else(|e| panic!("rank {}: reduce #{i} after shrink: {e}", r.rank));
            assert_eq!(w, 0, "rank {}: reduce #{i} after shrink", r.rank);
        }
    }
    let bad = every_collective(&kid);
    assert!(bad.is_empty(), "rank {}: {}", r.rank, bad.join("\n"));
    kid.destroy().unwrap();
    comm.destroy().unwrap();
    println!("PASS rank {}", r.rank);
}

fn run_case(name: &str, fault: Fault, env: &[(&str, &str)]) {
    let timeout = TIMEOUT_S.to_string();
    let mut vars = vec![("NCCL_TIMEOUT", timeout.as_str())];
    vars.extend_from_slice(env);
    let t = Instant::now();
    let done = spawn(name, 4, &vars, Duration::from_secs(90));
    eprintln!("{name}: {:?}", t.elapsed());
    let outs: Vec<(usize, &str)> = done
        .iter()
        .filter(|f| f.rank != VICTIM)
        .map(|f| (f.rank, f.stdout.as_str()))
        .collect();
    assert_eq!(outs.len(), 3);
    oxccl_tests::assert_same_exclude_list(&outs, &[VICTIM]);
    for f in &done {
        if f.rank == VICTIM && fault == Fault::Kill {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                f.status.and_then(|s| s.signal()),
                Some(Signal::SIGKILL as i32),
                "the victim was not killed: {:?}\n{}",
                f.status,
                f.stderr
            );
            continue;
        }
        if f.rank == VICTIM {
            assert!(
                f.status.is_some_and(|s| s.success()) && f.stdout.contains("VICTIM ERROR"),
                "the stopped victim did not end in an error once woken: {:?}\n--- stdout\n{}\n--- stderr\n{}",
                f.status,
                f.stdout,
                f.stderr
            );
            eprintln!("{}", f.stdout.trim_end());
            continue;
        }
        assert!(
            f.status.is_some_and(|s| s.success()) && f.stdout.contains("PASS"),
            "rank {}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            f.rank,
            f.status,
            f.stdout,
            f.stderr
        );
        eprintln!("{}", f.stderr.trim_end());
    }
}

/// Same host, shared memory: the dead rank's ring goes silent, so the
/// survivors fail at NCCL_TIMEOUT, with the rank named as not answering.
#[test]
fn killed_rank_revoke_then_shrink_default() {
    let name = "killed_rank_revoke_then_shrink_default";
    if as_child(name, |r| survive(r, ShrinkMode::Default, true, Fault::Kill)) {
        return;
    }
    run_case(name, Fault::Kill, &[]);
}

/// Through the socket network: the dead rank's connections break at once;
/// NCCL_SHRINK_ABORT with no revoke before it.
#[test]
fn killed_rank_shrink_abort_over_the_network() {
    let name = "killed_rank_shrink_abort_over_the_network";
    if as_child(name, |r| survive(r, ShrinkMode::Abort, false, Fault::Kill)) {
        return;
    }
    run_case(name, Fault::Kill, &[("NCCL_SHM_DISABLE", "1")]);
}

/// A SIGSTOPped rank: the survivors time out naming it, shrink it away
/// and go on; woken, it ends its operation in an error.
#[test]
fn stopped_rank_is_shrunk_away_and_errs_when_woken() {
    let name = "stopped_rank_is_shrunk_away_and_errs_when_woken";
    if as_child(name, |r| survive(r, ShrinkMode::Abort, true, Fault::Stop)) {
        return;
    }
    run_case(name, Fault::Stop, &[]);
}

/// 20 checked all-reduces and every collective on `comm`, which must have
/// `n` ranks with this rank at `rank`.
fn check_comm(comm: &Comm, n: usize, rank: usize, round: u64) {
    assert_eq!((comm.count(), comm.user_rank()), (n, rank));
    let mut buf = vec![0u8; ELEMS * 4];
    for i in 0..20 {
        let w = checked_all_reduce(comm, round * 100 + i, &mut buf).unwrap();
        assert_eq!(w, 0, "{n} ranks: all_reduce #{i}");
    }
    let bad = every_collective(comm);
    assert!(bad.is_empty(), "{n} ranks, rank {rank}: {}", bad.join("\n"));
}

/// A job of ranks 0 and 1 grows to 4: rank 0 of the pair makes the id
/// (its partner receives it inside grow), the application hands it to the
/// two new processes (here over a launcher communicator), all four check
/// every collective, then ranks 2 and 3 leave and 0 and 1 shrink back and
/// check again.
#[test]
fn grow_from_two_processes_to_four_and_back() {
    let name = "grow_from_two_processes_to_four_and_back";
    if as_child(name, |r| {
        let world = r.comm(&[]);
        let cfg = CommConfig::default();
        let color = if r.rank < 2 { 0 } else { SPLIT_NOCOLOR };
        let pair = world.split(color, 0, &cfg).unwrap();
        let mut id = [0u8; 128];
        if let Some(p) = &pair {
            check_comm(p, 2, r.rank, 1);
            if p.user_rank() == 0 {
                id = p.grow_id().unwrap().0;
            }
        }
        world.broadcast(None, &mut id, DataType::Uint8, 0).unwrap();
        let id = UniqueId(id);
        let t = Instant::now();
        let big = match &pair {
            Some(p) => p.grow(4, (p.user_rank() == 0).then_some(id), &cfg),
            None => Comm::init_rank(4, id, r.rank, &cfg),
        }
        .unwrap_or_else(|e| panic!("rank {}: grow: {e}", r.rank));
        eprintln!("rank {}: grown to 4 in {:?}", r.rank, t.elapsed());
        check_comm(&big, 4, r.rank, 2);
        if let Some(p) = &pair {
            let back = big.shrink(&[2, 3], &cfg, ShrinkMode::Default).unwrap();
            check_comm(&back, 2, r.rank, 3);
            back.destroy().unwrap();
            p.destroy().unwrap();
        }
        big.destroy().unwrap();
        world.destroy().unwrap();
        println!("PASS rank {}", r.rank);
    }) {
        return;
    }
    let done = spawn(name, 4, &[], Duration::from_secs(90));
    oxccl_tests::assert_all_ok(&done);
    for f in &done {
        assert!(f.stdout.contains("PASS"), "rank {}: {}", f.rank, f.stdout);
        eprintln!("{}", f.stderr.trim_end());
    }
}
