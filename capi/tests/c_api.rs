//! The C API as C programs use it: tests/c/*.c are compiled with the system
//! C compiler against include/nccl.h and this crate's libnccl.so, then run
//! as several processes on host memory. Each run is bounded in time; a run
//! that overstays is killed and fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the libnccl.so cargo built for this test run.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let up = deps.parent().expect("profile dir").to_path_buf();
    [deps, up]
        .into_iter()
        .find(|d| d.join("libnccl.so").exists())
        .expect("libnccl.so next to the test binary: build with `cargo test -p oxccl-capi`")
}

fn compile(src: &str, out: &Path, lib: &Path) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(dir.join("tests/c").join(src))
        .arg(format!("-I{}", dir.join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lnccl", "-lm"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e} (install gcc)"));
    assert!(st.success(), "compiling {src} failed");
}

/// A fresh directory holding the library under both names (libnccl.so to
/// link against, libnccl.so.2, the SONAME a linked program loads) and
/// `src` compiled against it.
fn stage(tag: &str, src: &str) -> (PathBuf, PathBuf) {
    let lib = lib_dir();
    let tmp = std::env::temp_dir().join(format!("oxccl-capi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    for name in ["libnccl.so.2", "libnccl.so"] {
        std::fs::copy(lib.join("libnccl.so"), tmp.join(name)).expect("copy libnccl.so");
    }
    let exe = tmp.join(src.trim_end_matches(".c"));
    compile(src, &exe, &tmp);
    (tmp, exe)
}

/// Waits for `child`, killing it past `limit`; its success and its stdout
/// followed by its stderr.
fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    while child.try_wait().expect("poll").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().expect("collect output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Runs `n` ranks of `exe`; returns each one's (success, output).
fn run_ranks(exe: &Path, n: usize, timeout: Duration) -> Vec<(bool, String)> {
    run_ranks_with(exe, &[], n, timeout)
}

/// As [`run_ranks`], with arguments.
fn run_ranks_with(exe: &Path, args: &[&str], n: usize, timeout: Duration) -> Vec<(bool, String)> {
    let port = free_port();
    let mut kids: Vec<Child> = (0..n)
        .map(|r| {
            Command::new(exe)
                .args(args)
                .env("OXCCL_TEST_RANK", r.to_string())
                .env("OXCCL_TEST_NRANKS", n.to_string())
                .env("OXCCL_TEST_SEED", "7")
                .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
                .env("NCCL_SOCKET_IFNAME", "lo")
                .env("NCCL_TIMEOUT", "20")
                .env("NCCL_DEBUG", "VERSION")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let start = Instant::now();
    loop {
        let done = kids.iter_mut().all(|k| matches!(k.try_wait(), Ok(Some(_))));
        if done {
            break;
        }
        if start.elapsed() > timeout {
            for k in kids.iter_mut() {
                let _ = k.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kids.into_iter()
        .map(|k| {
            let o = k.wait_with_output().expect("collect a rank's output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            (o.status.success(), text)
        })
        .collect()
}

#[test]
fn c_programs_drive_every_collective_over_several_processes() {
    let (tmp, exe) = stage("api", "api_test.c");
    for n in [1, 2, 3, 4] {
        let t = Instant::now();
        let results = run_ranks(&exe, n, Duration::from_secs(120));
        for (r, (ok, out)) in results.iter().enumerate() {
            assert!(ok, "{n} ranks: rank {r} failed:\n{out}");
            assert!(
                out.contains("PASS"),
                "{n} ranks: rank {r} did not finish:\n{out}"
            );
            assert!(
                out.contains("NCCL version 2.31.2+oxccl"),
                "{n} ranks: rank {r} printed no NCCL version line naming oxccl:\n{out}"
            );
        }
        eprintln!("{n} rank(s): PASS in {:.1} s", t.elapsed().as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// NCCL 2.31's eight per-call collectives with configs on host buffers,
/// on 2 ranks, against a reference; the configs oxccl refuses or falls
/// back from (tests/c/coll_config.c).
#[test]
fn per_call_collectives_with_their_configs() {
    let (tmp, exe) = stage("collcfg", "coll_config.c");
    let t = Instant::now();
    let results = run_ranks(&exe, 2, Duration::from_secs(120));
    for (r, (ok, out)) in results.iter().enumerate() {
        assert!(*ok && out.contains("PASS"), "rank {r} failed:\n{out}");
    }
    eprintln!("2 ranks: PASS in {:.1} s", t.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// ncclResetDebugInit re-reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
/// NCCL_DEBUG_FILE (tests/c/debug_reset.c changes them between calls).
#[test]
fn reset_debug_init_rereads_the_logging_variables() {
    let (tmp, exe) = stage("reset", "debug_reset.c");
    let file = tmp.join("nccl-%p.log");
    let mut cmd = Command::new(&exe);
    cmd.args(["reset", file.to_str().unwrap()])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "20")
        .env("OXCCL_HOST_MEMORY", "1")
        .env_remove("NCCL_DEBUG")
        .env_remove("NCCL_DEBUG_SUBSYS")
        .env_remove("NCCL_DEBUG_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, text) = finish(
        cmd.spawn().expect("start debug_reset"),
        Duration::from_secs(60),
    );
    assert!(
        ok && text.contains("PASS reset"),
        "debug_reset failed:\n{text}"
    );
    let phase = |from: &str, to: &str| -> String {
        let a = text
            .find(from)
            .unwrap_or_else(|| panic!("no {from:?} in:\n{text}"));
        let b = text[a..].find(to).map_or(text.len(), |b| a + b);
        text[a..b].to_string()
    };
    let info = |s: &str| s.lines().filter(|l| l.contains(" NCCL INFO ")).count();
    let warn = phase("PHASE warn\n", "PHASE info");
    let on = phase("PHASE info", "PHASE file");
    let filed = phase("PHASE file", "PHASE warn again");
    let off = phase("PHASE warn again", "PASS reset");
    assert_eq!(info(&warn), 0, "NCCL_DEBUG=WARN showed INFO:\n{warn}");
    assert!(
        info(&on) > 0,
        "NCCL_DEBUG=INFO after the reset showed none:\n{on}"
    );
    assert_eq!(
        info(&filed),
        0,
        "NCCL_DEBUG_FILE set, yet INFO on stderr:\n{filed}"
    );
    assert_eq!(info(&off), 0, "back to WARN, yet INFO:\n{off}");
    let logs: Vec<_> = std::fs::read_dir(&tmp)
        .expect("temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("nccl-"))
        .collect();
    assert_eq!(logs.len(), 1, "one NCCL_DEBUG_FILE, its %p replaced");
    let logged = std::fs::read_to_string(logs[0].path()).expect("read the log file");
    assert!(info(&logged) > 0, "the file holds no INFO lines:\n{logged}");
    eprintln!(
        "INFO lines: {} under WARN, {} under INFO, {} in the file, {} under WARN again",
        info(&warn),
        info(&on),
        info(&logged),
        info(&off)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// ncclCommInitRankScalable through several roots as processes on host
/// memory: 2 ids for 4 ranks, 3 for 5, and 1; every rank gets the same
/// communicator (collectives right, one commHash), and a bad nId (0,
/// above nranks) is refused (tests/c/scalable.c).
#[test]
fn scalable_init_through_several_roots() {
    let (tmp, exe) = stage("scalable", "scalable.c");
    for (n, nid) in [(4, 2), (5, 3), (3, 1)] {
        let ids = tmp.join(format!("ids-{n}-{nid}"));
        let t = Instant::now();
        let results = run_ranks_with(
            &exe,
            &[&nid.to_string(), ids.to_str().unwrap()],
            n,
            Duration::from_secs(90),
        );
        let mut hashes = Vec::new();
        for (r, (ok, out)) in results.iter().enumerate() {
            assert!(
                *ok && out.contains("PASS"),
                "{n} ranks, {nid} ids: rank {r} failed:\n{out}"
            );
            let h = out
                .lines()
                .find_map(|l| l.split("commHash ").nth(1))
                .unwrap_or_else(|| panic!("rank {r} printed no commHash:\n{out}"));
            hashes.push(h.trim().to_string());
        }
        assert!(
            hashes.iter().all(|h| h == &hashes[0]),
            "{n} ranks, {nid} ids: commHash differs between ranks: {hashes:?}"
        );
        eprintln!(
            "{n} ranks through {nid} root(s): PASS in {:.1} s, commHash {}",
            t.elapsed().as_secs_f64(),
            hashes[0]
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn one_thread_creates_every_rank_inside_a_group() {
    let (tmp, exe) = stage("group", "group_init.c");
    let child = Command::new(&exe)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start group_init");
    let (ok, text) = finish(child, Duration::from_secs(60));
    assert!(ok && text.contains("PASS"), "group_init failed:\n{text}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Runs `exe mode` as one rank with `env`, bounded in time; returns its output.
fn run_one(exe: &Path, mode: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(exe);
    cmd.arg(mode)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "20")
        .env_remove("OXCCL_HOST_MEMORY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let prog = exe.file_name().unwrap_or_default().to_string_lossy();
    let child = cmd.spawn().unwrap_or_else(|e| panic!("start {prog}: {e}"));
    let (ok, text) = finish(child, Duration::from_secs(60));
    assert!(ok, "{prog} {mode} failed:\n{text}");
    assert!(
        text.contains(&format!("PASS {mode}")),
        "{prog} {mode}:\n{text}"
    );
    text
}

/// int8 counts of 2^40 and 2^62 on 256-byte host buffers: every call that
/// takes a count returns ncclInvalidArgument naming it, on 1 and 2 ranks, and
/// nothing crashes (tests/c/huge_count.c). Before, they passed validation
/// and the ranks died of SIGSEGV.
#[test]
fn huge_counts_on_small_host_buffers_are_refused() {
    let (tmp, exe) = stage("huge", "huge_count.c");
    // One rank too: there 2^62 bytes pass the check of count x ranks.
    for n in [1, 2] {
        let results = run_ranks(&exe, n, Duration::from_secs(60));
        for (r, (ok, out)) in results.iter().enumerate() {
            assert!(
                *ok && out.contains("PASS"),
                "{n} ranks: rank {r} failed:\n{out}"
            );
            if r == 0 {
                eprintln!("{n} rank(s):\n{out}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// NCCL's device choice through the C API, and buffers from the wrong side
/// refused with ncclInvalidArgument naming the argument (a C program for
/// each refusal). Without a GPU only the host-memory mode can run: the
/// device modes are skipped, saying so.
#[test]
fn device_choice_and_wrong_side_buffers() {
    let (tmp, exe) = stage("side", "wrong_side.c");
    let gpus = oxccl::cuda::device_count().unwrap_or(0);
    if gpus == 0 {
        run_one(&exe, "nogpu", &[]);
        eprintln!("no GPU here: the device-choice and GPU-buffer refusals were skipped (run on a GPU machine)");
    } else {
        let host = run_one(&exe, "host", &[("OXCCL_HOST_MEMORY", "1")]);
        let dev = run_one(&exe, "device", &[]);
        eprintln!("{host}{dev}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// NCCL 2.30's parameter API reads the settings `oxccl info` shows (here a
/// value set through the environment), ncclCommMemStats reports a host
/// communicator's 0 GPU bytes, grow's argument rules hold, and the calls
/// oxccl does not offer return ncclInvalidUsage naming themselves
/// (tests/c/params_stats.c).
#[test]
fn params_mem_stats_and_refusals() {
    let (tmp, exe) = stage("params", "params_stats.c");
    let out = run_one(
        &exe,
        "params",
        &[("OXCCL_HOST_MEMORY", "1"), ("NCCL_CHUNK_SIZE", "123456")],
    );
    // ncclParamDumpAll's listing, with where the value came from.
    assert!(
        out.contains("NCCL_CHUNK_SIZE = 123456 (from env"),
        "ncclParamDumpAll did not list NCCL_CHUNK_SIZE from the environment:\n{out}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A dead rank through the C API (tests/c/shrink.c): rank 1 of 4 SIGKILLs
/// itself in the middle of a stream of all-reduces; the survivors revoke,
/// shrink it away (NCCL_SHRINK_DEFAULT on blocking communicators,
/// NCCL_SHRINK_ABORT on non-blocking ones, polled through
/// ncclCommGetAsyncError) and check every collective on the three left.
#[test]
fn survivors_revoke_and_shrink_after_a_killed_rank() {
    let (tmp, exe) = stage("shrink", "shrink.c");
    for mode in ["revoke", "nonblocking"] {
        let t = Instant::now();
        let results = run_ranks_with(&exe, &[mode], 4, Duration::from_secs(120));
        for (r, (ok, out)) in results.iter().enumerate() {
            if r == 1 {
                assert!(!ok && !out.contains("PASS"), "{mode}: rank 1 lived:\n{out}");
                continue;
            }
            assert!(
                *ok && out.contains(&format!("PASS {mode}")),
                "{mode}: rank {r} failed:\n{out}"
            );
        }
        eprintln!("{mode}: PASS in {:.1} s", t.elapsed().as_secs_f64());
        eprintln!("{}", results[0].1.trim_end());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// ncclCommGetUniqueId and ncclCommGrow from C (tests/c/grow.c): one rank
/// grows to two with a thread joining as the new rank, both check an
/// all-reduce, the spent id is refused, and a shrink brings it back to one.
#[test]
fn grow_one_rank_to_two_and_back() {
    let (tmp, exe) = stage("grow", "grow.c");
    let out = run_one(&exe, "grow", &[("OXCCL_HOST_MEMORY", "1")]);
    eprintln!("{}", out.trim_end());
    let _ = std::fs::remove_dir_all(&tmp);
}
