//! NCCL's own profiler plugins under oxccl on host memory: the example
//! profiler (plugins/profiler/example) and the Inspector
//! (plugins/profiler/inspector), built from an NCCL source tree or git dir
//! named by OXCCL_NCCL_SRC (tools/nccl_profilers.sh does the build; the
//! test skips, saying why, without it). What the example records is checked
//! against NCCL's documented model (profiler_v5.h, profiler_v6.h,
//! plugins/profiler/README.md): Group API -> Coll API / P2p API -> Coll /
//! P2p -> ProxyOp -> ProxyStep, each with NCCL's states in NCCL's order,
//! and as many of each as the program made.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use oxccl::{DataType, RedOp};
use oxccl_tests::{as_child, assert_all_ok, spawn};

/// The program: 3 all-reduces and a broadcast of 64 KiB (the rings: above
/// the inline path, below the direct one), then a group of a send and a
/// receive of 64 KiB.
fn program(r: oxccl_tests::Rank) {
    oxccl::log::init();
    let comm = r.comm(&[]);
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..3 {
        comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
            .unwrap();
    }
    comm.broadcast(None, &mut buf, DataType::Float32, 0)
        .unwrap();
    let peer = 1 - r.rank;
    let out = vec![1u8; 64 << 10];
    let mut inp = vec![0u8; 64 << 10];
    let mut g = oxccl::Group::new();
    g.send(&comm, &out, DataType::Float32, peer).unwrap();
    g.recv(&comm, &mut inp, DataType::Float32, peer).unwrap();
    g.run().unwrap();
    comm.destroy().unwrap();
}

/// The plugins built from OXCCL_NCCL_SRC into `dir`, or why not.
fn build(dir: &Path) -> Result<PathBuf, String> {
    let src = std::env::var("OXCCL_NCCL_SRC")
        .map_err(|_| "OXCCL_NCCL_SRC is unset (an NCCL source tree or git dir)".to_string())?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("timeout")
        .arg("600")
        .arg("bash")
        .arg(root.join("tools/nccl_profilers.sh"))
        .arg("build")
        .arg(dir)
        .env("NCCL_SRC", &src)
        .output()
        .map_err(|e| format!("running tools/nccl_profilers.sh: {e}"))?;
    let lib = dir.join("lib");
    if !out.status.success() || !lib.join("libnccl-profiler-example.so").exists() {
        return Err(format!(
            "building NCCL's profilers from {src} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(lib)
}

/// One begin/end pair of the example's trace, with what it printed inside.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    cat: String,
    args: serde_json::Value,
    b: f64,
    e: f64,
    kids: Vec<Node>,
}

/// The example prints each event as a "b" and an "e" record, its children
/// between them (print_event.cc), so the nesting is its parent links.
fn tree(path: &Path) -> Vec<Node> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Vec<serde_json::Value> = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{path:?} is not JSON ({e}):\n{text}"));
    let mut stack: Vec<Node> = vec![Node {
        name: "root".into(),
        cat: String::new(),
        args: serde_json::Value::Null,
        b: 0.0,
        e: 0.0,
        kids: Vec::new(),
    }];
    for r in v.iter().filter(|r| r.get("ph").is_some()) {
        let ts = r["ts"].as_f64().unwrap();
        if r["ph"] == "b" {
            stack.push(Node {
                name: r["name"].as_str().unwrap().into(),
                cat: r["cat"].as_str().unwrap().into(),
                args: r["args"].clone(),
                b: ts,
                e: 0.0,
                kids: Vec::new(),
            });
        } else {
            let mut n = stack.pop().unwrap();
            assert_eq!(n.name, r["name"].as_str().unwrap(), "{path:?}: unbalanced");
            n.e = ts;
            stack.last_mut().unwrap().kids.push(n);
        }
    }
    assert_eq!(stack.len(), 1, "{path:?}: unbalanced");
    stack.pop().unwrap().kids
}

fn walk<'a>(ns: &'a [Node], out: &mut Vec<(&'a Node, Option<&'a Node>)>, parent: Option<&'a Node>) {
    for n in ns {
        out.push((n, parent));
        walk(&n.kids, out, Some(n));
    }
}

/// A proxy op as the example prints it: ScheduleX (start to "in progress")
/// then ProgressX (to its stop) holding its steps' state intervals.
fn check_proxy_ops(rank: usize, kids: &[Node], what: &str) -> usize {
    let mut ops = 0;
    let mut it = kids.iter();
    while let Some(sched) = it.next() {
        let dir = sched.name.strip_prefix("Schedule").unwrap_or_else(|| {
            panic!(
                "rank {rank}: {what} holds {} where a ProxyOp should be",
                sched.name
            )
        });
        let prog = it.next().expect("Progress follows Schedule");
        assert_eq!(prog.name, format!("Progress{dir}"), "rank {rank}");
        assert!(sched.kids.is_empty());
        // State 19 ("in progress") was recorded, after the start, before the stop.
        assert!(
            sched.b > 0.0 && sched.e >= sched.b && prog.e >= prog.b && prog.b == sched.e,
            "rank {rank}: {sched:?} {prog:?}"
        );
        assert_eq!(
            prog.args["Peer"],
            (1 - rank) as u64,
            "rank {rank}: {prog:?}"
        );
        assert!(prog.args["Channel"].as_u64().unwrap() < 32);
        let n = prog.args["Steps"].as_u64().unwrap() as usize;
        // NCCL's step states, as the example turns them into intervals.
        let names: &[&str] = if dir == "Send" {
            &["SendGpuWait", "SendPeerWait", "SendWait"]
        } else {
            &["RecvWait", "RecvFlushWait", "RecvGpuWait"]
        };
        assert_eq!(prog.kids.len(), 3 * n.min(32), "rank {rank}: {prog:?}");
        for (i, step) in prog.kids.chunks(3).enumerate() {
            let got: Vec<&str> = step.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(got, names, "rank {rank}");
            // Each state after the one before it: a state never recorded
            // shows as a 0 timestamp here.
            for s in step {
                assert_eq!(s.args["Step"], i as u64, "rank {rank}: {step:?}");
                assert!(s.b > 0.0 && s.e >= s.b, "rank {rank}: {step:?}");
            }
            assert!(step[0].e == step[1].b && step[1].e == step[2].b, "{step:?}");
            assert!(
                step[0].b >= prog.b && step[2].e <= prog.e,
                "rank {rank}: {step:?} in {prog:?}"
            );
        }
        assert!(
            prog.args["transSize"].as_u64().unwrap() >= 64 << 10,
            "rank {rank}: {prog:?}"
        );
        ops += 1;
    }
    ops
}

fn check_example(lib: &Path, dir: &Path) {
    let name = "example_profiler_records_nccls_event_tree";
    let dump = dir.join("trace");
    let mut env: Vec<(String, String)> = vec![
        (
            "NCCL_PROFILER_PLUGIN".into(),
            lib.join("libnccl-profiler-example.so")
                .display()
                .to_string(),
        ),
        ("NCCL_PROFILE_EVENT_MASK".into(), "4095".into()),
        ("NCCL_PROFILE_DUMP_FILE".into(), dump.display().to_string()),
        ("NCCL_CHUNK_SIZE".into(), "16K".into()),
        // The network path, where NCCL records proxy events (the direct
        // path between processes of one host has none).
        ("NCCL_SHM_DISABLE".into(), "1".into()),
        // Every proxy-control event, not the last 16.
        ("NCCL_PROFILE_PROXY_CTRL_POOL_SIZE".into(), "100000".into()),
        // The line naming the version loaded.
        ("NCCL_DEBUG".into(), "INFO".into()),
        ("NCCL_DEBUG_SUBSYS".into(), "INIT".into()),
    ];
    for p in [
        "GROUP_API",
        "COLL_API",
        "P2P_API",
        "KERNEL_LAUNCH",
        "COLL",
        "P2P",
    ] {
        env.push((format!("NCCL_PROFILE_{p}_POOL_SIZE"), "64".into()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let done = spawn(name, 2, &env, Duration::from_secs(120));
    assert_all_ok(&done);
    // NCCL 2.31's example (its sources carry profiler_v7.h) exports v5 to
    // v7: oxccl takes v7, whose collective descriptor adds the kernel
    // variant (none: no symmetric kernels here).
    let v7 = lib
        .join("../src/plugins/profiler/example/nccl/profiler_v7.h")
        .exists();
    if v7 {
        for f in &done {
            assert!(
                f.stderr.contains("(ncclProfiler_v7)"),
                "rank {}:\n{}",
                f.rank,
                f.stderr
            );
        }
    }
    for rank in 0..2 {
        let suffix = format!("_{rank}.json");
        let file = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(&suffix))
            .unwrap_or_else(|| panic!("rank {rank} wrote no trace in {dir:?}"));
        let roots = tree(&file);
        let mut all = Vec::new();
        walk(&roots, &mut all, None);
        let count = |cat: &str| all.iter().filter(|(n, _)| n.cat == cat).count();
        // Per rank: a group API event per call outside a group and one for
        // the group; an API event per call; no Group events (NCCL gives
        // them no parent, and the example keeps none without one), no
        // kernel launches on host memory; kernel-channel events ("GPU"),
        // one per channel of each operation, are checked below.
        let kinds = [
            "GROUP_API",
            "COLL_API",
            "P2P_API",
            "COLL",
            "P2P",
            "KERNEL_LAUNCH",
            "GROUP",
        ];
        let got: Vec<usize> = kinds.iter().map(|k| count(k)).collect();
        assert_eq!(got, [5, 4, 2, 4, 2, 0, 0], "rank {rank}: {kinds:?}");
        let mut channels = 0;
        let depths: Vec<u64> = roots
            .iter()
            .filter(|g| g.cat == "GROUP_API")
            .map(|g| g.args["groupDepth"].as_u64().unwrap())
            .collect();
        assert_eq!(depths, [1, 1, 1, 1, 2], "rank {rank}");
        let mut seqs = Vec::new();
        let mut proxy = 0;
        for (n, parent) in &all {
            let parent_cat = parent.map(|p| p.cat.as_str());
            match n.cat.as_str() {
                "GROUP_API" => assert_eq!(parent_cat, None),
                "COLL_API" | "P2P_API" => assert_eq!(parent_cat, Some("GROUP_API"), "{n:?}"),
                "COLL" | "P2P" => {
                    let p = parent.unwrap();
                    let api = if n.cat == "COLL" {
                        "COLL_API"
                    } else {
                        "P2P_API"
                    };
                    assert_eq!(p.cat, api, "rank {rank}: {n:?}");
                    assert_eq!((&p.name, p.kids.len()), (&n.name, 1), "rank {rank}: {p:?}");
                    assert_eq!(n.args["Count"], 16384, "{n:?}");
                    if v7 && n.cat == "COLL" {
                        assert_eq!(n.args["KernelVariant"], "", "{n:?}");
                        assert_eq!(n.args["IsSymColl"], 0, "{n:?}");
                    }
                    assert_eq!(n.args["Datatype"], "ncclFloat32", "{n:?}");
                    assert_eq!(n.args["Rank"], rank as u64, "{n:?}");
                    if n.cat == "COLL" {
                        seqs.push((n.name.clone(), n.args["SeqNum"].as_u64().unwrap()));
                    } else {
                        assert_eq!(n.args["Peer"], (1 - rank) as u64, "{n:?}");
                    }
                    // Host memory runs no kernel, but reports the channels
                    // (lanes) each operation ran on as kernel-channel
                    // events, host clock times, for profilers that
                    // complete an operation on them (the Inspector).
                    // The example prints a channel's proxy ops inside its
                    // kernel-channel event.
                    let (gpu, kids): (Vec<&Node>, Vec<&Node>) =
                        n.kids.iter().partition(|k| k.cat == "GPU");
                    assert!(!gpu.is_empty(), "rank {rank}: {n:?} has no KernelCh");
                    for k in &gpu {
                        let clk = |f: &str| k.args[f].as_u64().unwrap();
                        assert!(
                            clk("StartGpuClk") > 0 && clk("StopGpuClk") >= clk("StartGpuClk"),
                            "rank {rank}: {k:?}"
                        );
                    }
                    channels += gpu.len();
                    let kids: Vec<Node> = gpu
                        .iter()
                        .flat_map(|k| k.kids.iter())
                        .chain(kids)
                        .cloned()
                        .collect();
                    let ops = check_proxy_ops(rank, &kids, &n.name);
                    assert!(ops >= 1, "rank {rank}: {n:?} has no proxy op");
                    proxy += ops;
                }
                _ => {}
            }
        }
        // NCCL numbers each function's collectives on its own.
        let want: Vec<(String, u64)> = [
            ("AllReduce", 0),
            ("AllReduce", 1),
            ("AllReduce", 2),
            ("Broadcast", 0),
        ]
        .iter()
        .map(|(f, s)| (f.to_string(), *s))
        .collect();
        assert_eq!(seqs, want, "rank {rank}");
        // Proxy-control events (proxy.cc): each is its own root, "Append"
        // (with the proxy ops taken on) once per network call, "Idle" for
        // a pass that moved nothing or one that moved again, "Sleep" for a
        // nap. The host path's calls run on the caller's thread, which is
        // the proxy there.
        let names = ["Append", "Idle", "Sleep"];
        let ctrl: Vec<&Node> = roots.iter().filter(|n| n.cat == "PROXY").collect();
        assert!(
            ctrl.iter().all(|n| names.contains(&n.name.as_str())),
            "rank {rank}: {ctrl:?}"
        );
        assert!(
            all.iter()
                .all(|(n, p)| p.is_none() || !names.contains(&n.name.as_str())),
            "rank {rank}: a proxy-control event has a parent"
        );
        let appends: Vec<u64> = ctrl
            .iter()
            .filter(|n| n.name == "Append")
            .map(|n| n.args["appended"].as_u64().unwrap())
            .collect();
        assert_eq!(appends.len(), 5, "rank {rank}: one per call: {appends:?}");
        assert!(appends.iter().all(|&a| a >= 1), "rank {rank}: {appends:?}");
        // Network events through the net plugin's profiler callback
        // (mask 4095 has ncclProfileNetPlugin): the socket network reports
        // one per socket transfer in NCCL's socket layout, which the
        // example prints inside the proxy step that posted it.
        let socks: Vec<&(&Node, Option<&Node>)> =
            all.iter().filter(|(n, _)| n.cat == "NET_SOCK").collect();
        assert!(!socks.is_empty(), "rank {rank}: no NET_SOCK events");
        let mut parents: Vec<&str> = socks
            .iter()
            .map(|(_, p)| p.map_or("none", |p| p.name.as_str()))
            .collect();
        parents.sort();
        parents.dedup();
        // The example prints a step's network events inside its wait
        // interval (the network has the transfer).
        assert!(
            parents.iter().all(|p| ["SendWait", "RecvWait"].contains(p)),
            "rank {rank}: {parents:?}"
        );
        for (n, _) in &socks {
            assert_eq!(n.name, "Sock", "{n:?}");
            assert!(n.args["sock"].as_i64().unwrap() > 0, "{n:?}");
            assert!(n.args["size"].as_u64().unwrap() > 0, "{n:?}");
            assert!([0, 1].contains(&n.args["op"].as_u64().unwrap()), "{n:?}");
            assert!(n.e >= n.b, "{n:?}");
        }
        eprintln!(
            "rank {rank}: {} events, {proxy} proxy ops, {channels} kernel-channel events, {} proxy-control events (appended {appends:?}), {} socket events (inside {parents:?})",
            all.len(),
            ctrl.len(),
            socks.len()
        );
    }
}

/// The Inspector asks for Coll, P2p and KernelCh events and reports an
/// operation once all its kernel channels have ended; it also needs the
/// CUDA driver and a current device for each communicator. On a machine
/// without a driver it disables itself at init (a NULL context, which gets
/// no finalize: it crashed under oxccl before); the run must go on.
fn check_inspector(lib: &Path, dir: &Path) {
    let name = "example_profiler_records_nccls_event_tree";
    let plugin = lib
        .join("libnccl-profiler-inspector.so")
        .display()
        .to_string();
    let dump = dir.join("inspector").display().to_string();
    let env = [
        ("NCCL_PROFILER_PLUGIN", plugin.as_str()),
        ("NCCL_INSPECTOR_ENABLE", "1"),
        ("NCCL_INSPECTOR_DUMP_DIR", dump.as_str()),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "ALL"),
    ];
    let done = spawn(name, 2, &env, Duration::from_secs(120));
    assert_all_ok(&done);
    let driver = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    for f in &done {
        assert!(
            f.stderr.contains("loaded profiler plugin Inspector"),
            "{}",
            f.stderr
        );
        if !driver {
            assert!(
                f.stderr
                    .contains("Inspector: Failed to load CUDA driver library"),
                "rank {}:\n{}",
                f.rank,
                f.stderr
            );
        }
    }
    // With a driver (the build's host-only stand-in where none is
    // installed) it runs, and completes each operation when its last
    // kernel-channel event stops: host memory reports one per lane.
    let stand_in = lib.join("../hostdrv");
    if !driver && !stand_in.join("libcuda.so.1").exists() {
        eprintln!("Inspector records not checked: no CUDA driver and no stand-in");
        return;
    }
    let dump = dir.join("inspector-records");
    let dump_s = dump.display().to_string();
    let mut path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    if !driver {
        path = format!("{}:{path}", stand_in.display());
    }
    let env = [
        ("NCCL_PROFILER_PLUGIN", plugin.as_str()),
        ("NCCL_INSPECTOR_ENABLE", "1"),
        ("NCCL_INSPECTOR_DUMP_DIR", dump_s.as_str()),
        ("NCCL_INSPECTOR_DUMP_VERBOSE", "1"),
        ("NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES", "0"),
        ("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS", "500"),
        ("LD_LIBRARY_PATH", path.as_str()),
    ];
    let done = spawn(name, 2, &env, Duration::from_secs(120));
    assert_all_ok(&done);
    let mut recs: std::collections::BTreeMap<(u64, String, String), usize> = Default::default();
    for f in files_under(&dump) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for v in serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>() {
            let Ok(v) = v else { break };
            for k in ["coll_perf", "p2p_perf"] {
                if let Some(p) = v.get(k) {
                    let op = p
                        .get("coll")
                        .or_else(|| p.get("p2p_operation"))
                        .and_then(|o| o.as_str())
                        .unwrap_or("?");
                    let rank = v["header"]["rank"].as_u64().unwrap_or(u64::MAX);
                    *recs
                        .entry((rank, k.to_string(), op.to_string()))
                        .or_default() += 1;
                }
            }
        }
    }
    eprintln!("Inspector records: {recs:?}");
    for rank in 0..2u64 {
        let colls: Vec<&String> = recs
            .keys()
            .filter(|(r, k, _)| *r == rank && k == "coll_perf")
            .map(|(_, _, op)| op)
            .collect();
        assert!(
            !colls.is_empty(),
            "rank {rank}: the Inspector wrote no collective record: {recs:?}"
        );
        assert!(
            colls
                .iter()
                .all(|op| ["AllReduce", "Broadcast"].contains(&op.as_str())),
            "rank {rank}: {recs:?}"
        );
    }
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn example_profiler_records_nccls_event_tree() {
    let name = "example_profiler_records_nccls_event_tree";
    if as_child(name, program) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("oxccl-nccl-profilers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = match build(&dir) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: {why}");
            std::fs::remove_dir_all(&dir).ok();
            return;
        }
    };
    let traces = dir.join("example");
    std::fs::create_dir_all(&traces).unwrap();
    check_example(&lib, &traces);
    check_inspector(&lib, &dir);
    if std::env::var_os("OXCCL_KEEP_TRACES").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}
