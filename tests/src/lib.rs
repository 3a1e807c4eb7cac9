//! The harness of the multi-process tests: a test re-runs its own test
//! binary as N child processes, each one rank, joined to a communicator
//! rooted in the parent, all bounded by a time limit and killed past it.

use std::time::Duration;

pub mod gpu;
pub mod tree;

pub use oxccl_cli::check;
pub use oxccl_cli::check::checked_all_reduce;
use oxccl_cli::launch::{self, Finished, Output};

const CHILD: &str = "OXCCL_TEST_CHILD";

/// What a child rank gets.
pub struct Rank {
    pub rank: usize,
    pub nranks: usize,
    pub id: oxccl::UniqueId,
}

impl Rank {
    /// Joins the test's communicator with extra settings.
    pub fn comm(&self, settings: &[(&str, &str)]) -> oxccl::Comm {
        let mut cfg = oxccl::CommConfig::default();
        for (k, v) in settings {
            cfg = cfg.with(k, v);
        }
        oxccl::Comm::init_rank(self.nranks, self.id, self.rank, &cfg).expect("init_rank")
    }
}

/// Every collective (float32 sum, out of place), rooted at `root`, at each
/// of `sizes` bytes, on random data checked against the host's reference
/// (#wrong 0, else a panic naming the case).
pub fn check_every_collective(comm: &oxccl::Comm, root: usize, sizes: &[usize]) {
    for coll in check::Coll::ALL {
        for &size in sizes {
            let case = oxccl_cli::perf::Case {
                coll,
                dtype: oxccl::DataType::Float32,
                op: oxccl::RedOp::Sum,
                root,
                size,
                inplace: false,
            };
            assert_eq!(case.check_once(comm).unwrap(), 0, "{case:?}");
        }
    }
}

/// Every survivor's output (rank, stdout) has a line `EXCLUDE <failure
/// record>` naming the ranks `want`, and every record is the same (ranks,
/// collective number and operation); prints each.
pub fn assert_same_exclude_list(outputs: &[(usize, &str)], want: &[usize]) {
    let mut first: Option<oxccl::Failure> = None;
    for (rank, out) in outputs {
        let line = out
            .lines()
            .find_map(|l| l.split_once("EXCLUDE ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("rank {rank} printed no exclude list:\n{out}"));
        let f = oxccl::Failure::parse(line)
            .unwrap_or_else(|| panic!("rank {rank} printed no failure record: {line}"));
        assert_eq!(f.ranks, want, "rank {rank}'s exclude list: {line}");
        eprintln!("rank {rank}: {line}");
        let first = first.get_or_insert_with(|| f.clone());
        assert_eq!(*first, f, "survivors' failure records differ");
    }
}

/// In a child: runs `body` as this rank and returns true. In the parent:
/// returns false (the parent then calls [`spawn`]).
pub fn as_child(name: &str, body: impl FnOnce(Rank)) -> bool {
    if std::env::var(CHILD).ok().as_deref() != Some(name) {
        return false;
    }
    let env = launch::from_env()
        .expect("rank environment")
        .expect("launched by the harness");
    body(Rank {
        rank: env.rank,
        nranks: env.nranks,
        id: env.id,
    });
    true
}

/// Starts `n` children running the test `name` (its full path as the test
/// harness names it), with `env`, and returns how each ended.
pub fn spawn(name: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Vec<Finished> {
    let args = vec![
        name.to_string(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ];
    let mut vars: Vec<(String, String)> = vec![
        (CHILD.into(), name.into()),
        ("NCCL_SOCKET_IFNAME".into(), "lo".into()),
        ("NCCL_TIMEOUT".into(), "20".into()),
    ];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    launch::spawn(n, &args, &vars, Output::Capture, limit, limit).expect("spawn ranks")
}

/// Runs `body` on `n` ranks as processes and asserts every one succeeded.
pub fn run(name: &str, n: usize, body: impl FnOnce(Rank)) {
    if as_child(name, body) {
        return;
    }
    // On a 2-core machine, 7 ranks with the tree forced took 82 s alone and
    // over 120 s beside the other tests of their binary.
    let done = spawn(name, n, &[], Duration::from_secs(240));
    assert_all_ok(&done);
}

pub fn assert_all_ok(done: &[Finished]) {
    let bad: Vec<String> = done
        .iter()
        .filter(|f| !f.status.is_some_and(|s| s.success()))
        .map(|f| {
            format!(
                "rank {} ended {:?}\n--- stdout\n{}\n--- stderr\n{}",
                f.rank, f.status, f.stdout, f.stderr
            )
        })
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A library cargo built with this test binary (target/<profile>/deps/,
/// where `cargo test` puts it, or target/<profile>/ after `cargo build`).
pub fn built_library(name: &str) -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?.to_path_buf();
    let up = deps.parent()?.to_path_buf();
    [deps, up]
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// The complete events ("ph": "X") of rank `rank`'s trace written by our
/// profiler plugin into `dir`.
pub fn trace_events(dir: &std::path::Path, rank: usize) -> Vec<serde_json::Value> {
    let suffix = format!("-rank{rank}.json");
    let path = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&suffix))
        .unwrap_or_else(|| panic!("no trace of rank {rank} in {dir:?}"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("trace is JSON");
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .cloned()
        .collect()
}

/// Whether rank `f` took the direct host path, as its INIT log says
/// (`NCCL_DEBUG=INFO`, `NCCL_DEBUG_SUBSYS=INIT`): false, said on stderr,
/// where the kernel refused cross-process reads on this machine; a panic
/// where it took the rings for any other reason.
pub fn took_direct_path(f: &Finished) -> bool {
    let log = format!("{}{}", f.stdout, f.stderr);
    if log.contains("may not read rank") {
        eprintln!("rank {}: the direct path was refused here: {log}", f.rank);
        return false;
    }
    assert!(
        log.contains("read peers' buffers directly"),
        "rank {} did not take the direct path:\n{log}",
        f.rank
    );
    true
}
