//! Network plugins loaded from libraries through NCCL's C ABI: our socket
//! net's `.so` carries collectives; a library that exports no version we
//! know is refused with a WARN line and the built-in network is used.

use std::path::PathBuf;
use std::time::Duration;

use oxccl::{DataType, RedOp};
use oxccl_cli::perf::Case;
use oxccl_tests::check::Coll;
use oxccl_tests::tree::{tree_of, TreeEvent};
use oxccl_tests::{as_child, assert_all_ok, built_library, spawn, trace_events};

/// The cdylib cargo built with this test binary (target/<profile>/deps/,
/// where `cargo test` puts it, or target/<profile>/ after `cargo build`).
fn plugin_path() -> Option<PathBuf> {
    built_library("liboxccl_net_socket.so")
}

fn run_with_plugin(name: &str, plugin: &str) -> Vec<oxccl_cli::launch::Finished> {
    let done = spawn(
        name,
        2,
        // Ranks of one host would otherwise bypass the plugin through SHM.
        &[
            ("NCCL_NET_PLUGIN", plugin),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_SHM_DISABLE", "1"),
        ],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    done
}

fn body(expect_net: &str) -> impl FnOnce(oxccl_tests::Rank) + '_ {
    move |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        assert_eq!(comm.net_name().unwrap(), expect_net);
        for coll in [Coll::AllReduce, Coll::AllGather, Coll::SendRecv] {
            for size in [8usize, 1 << 20] {
                let case = Case {
                    coll,
                    dtype: DataType::Float32,
                    op: RedOp::Sum,
                    root: 0,
                    size,
                    inplace: false,
                };
                assert_eq!(case.check_once(&comm).unwrap(), 0, "{case:?}");
            }
        }
    }
}

#[test]
fn socket_plugin_library_carries_collectives() {
    let name = "socket_plugin_library_carries_collectives";
    if as_child(name, body("oxccl-Socket")) {
        return;
    }
    let Some(p) = plugin_path() else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    println!("loading {}", p.display());
    run_with_plugin(name, p.to_str().unwrap());
}

/// The IB plugin on a machine with no RDMA device (this one, CI): it loads,
/// reports 0 devices with one line saying why, and collectives run on the
/// built-in socket network.
#[test]
fn ib_plugin_without_a_device_falls_back_to_socket() {
    let name = "ib_plugin_without_a_device_falls_back_to_socket";
    if as_child(name, body("Socket")) {
        return;
    }
    if std::path::Path::new("/sys/class/infiniband").exists() {
        println!("skipped: this machine has RDMA devices, so the IB plugin may be used");
        return;
    }
    let Some(p) = built_library("liboxccl_net_ib.so") else {
        println!("skipped: liboxccl_net_ib.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    println!("loading {}", p.display());
    // The plugin's reason is an INFO line, passed through NCCL's logger.
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_NET_PLUGIN", p.to_str().unwrap()),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_SHM_DISABLE", "1"),
        ],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    for f in &done {
        let why: Vec<&str> = f
            .stderr
            .lines()
            .filter(|l| l.contains("NET/IB") && l.contains("0 devices"))
            .collect();
        assert!(
            why.len() == 1
                && (why[0].contains("libibverbs.so.1 not found")
                    || why[0].contains("no IB device")),
            "rank {} stderr lacks the one line saying why IB has no device:\n{}",
            f.rank,
            f.stderr
        );
        println!("rank {}: {}", f.rank, why[0]);
    }
}

#[test]
fn library_without_a_known_version_falls_back_with_a_warning() {
    let name = "library_without_a_known_version_falls_back_with_a_warning";
    if as_child(name, body("Socket")) {
        return;
    }
    // libc opens fine and exports no ncclNetPlugin_v* symbol.
    let done = run_with_plugin(name, "libc.so.6");
    for f in &done {
        assert!(
            f.stderr.contains("libc.so.6")
                && f.stderr.contains("no net ABI version this oxccl loads")
                && f.stderr.contains("looked for ncclNetPlugin_v12")
                && f.stderr.contains("found none"),
            "rank {} stderr lacks the WARN line:\n{}",
            f.rank,
            f.stderr
        );
    }
}

/// A NCCL_NET_PLUGIN naming a library that is not there: NCCL 2.30 says it
/// could not load it and goes on with its internal networks; so does
/// oxccl, with one WARN line on each rank naming what was tried (it used
/// to stop every rank: issue 40, item 12).
#[test]
fn missing_plugin_library_warns_and_every_rank_takes_the_builtin_network() {
    let name = "missing_plugin_library_warns_and_every_rank_takes_the_builtin_network";
    if as_child(name, body("Socket")) {
        return;
    }
    let done = spawn_with(
        name,
        &[
            ("NCCL_NET_PLUGIN", "no-such-net"),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_SHM_DISABLE", "1"),
        ],
    );
    for f in &done {
        let lines: Vec<&str> = f
            .stderr
            .lines()
            .filter(|l| l.contains("no-such-net"))
            .collect();
        assert_eq!(lines.len(), 1, "rank {}:\n{}", f.rank, f.stderr);
        assert!(
            lines[0].contains("NCCL WARN NCCL_NET_PLUGIN=no-such-net: no such library (tried no-such-net, libnccl-net-no-such-net.so); using the built-in network"),
            "rank {}: {}",
            f.rank,
            lines[0]
        );
    }
}

/// A net plugin that starts on one rank and fails on the other (as
/// aws-ofi-nccl does on a rank whose NIC has no carrier yet): the failing
/// rank used to fall back to the socket network silently, and the job to
/// fail at its first connection ("bad magic"). Now every rank fails at
/// init within seconds, naming which rank uses which network and why
/// (issue 40, item 10).
#[test]
fn ranks_on_different_networks_fail_at_init_naming_them() {
    let name = "ranks_on_different_networks_fail_at_init_naming_them";
    let Some(socket) = plugin_path() else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let socket = socket.to_str().unwrap().to_string();
    let initfail = fixture("net_initfail");
    let (s, f) = (socket.clone(), initfail.clone());
    if as_child(name, move |r| {
        oxccl::log::init();
        let lib = if r.rank == 0 { &s } else { &f };
        let cfg = oxccl::CommConfig::default().with("NET_PLUGIN", lib);
        let start = std::time::Instant::now();
        match oxccl::Comm::init_rank(r.nranks, r.id, r.rank, &cfg) {
            Ok(_) => println!("INIT OK"),
            Err(e) => println!("INIT FAILED after {:?}: {e}", start.elapsed()),
        }
    }) {
        return;
    }
    let done = spawn_with(name, &[("NCCL_DEBUG", "WARN")]);
    for d in &done {
        let out = &d.stdout;
        let line = out
            .lines()
            .find_map(|l| l.find("INIT FAILED").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("rank {} did not fail:\n{out}\n{}", d.rank, d.stderr));
        println!("rank {}: {line}", d.rank);
        assert!(
            line.contains("ranks use different networks")
                && line.contains(&format!("rank 0 uses oxccl-Socket (the plugin {socket})"))
                && line.contains(&format!(
                    "rank 1 uses Socket (built in, as net plugin {initfail}"
                ))
                && line.contains("init failed"),
            "rank {}: {line}",
            d.rank
        );
    }
    // The rank that fell back said why, once.
    assert_eq!(
        done[1]
            .stderr
            .lines()
            .filter(|l| l.contains("NCCL WARN") && l.contains(&initfail))
            .count(),
        1,
        "{}",
        done[1].stderr
    );
}

/// A fixture library built by build.rs from tests/fixtures/NAME.c.
fn fixture(name: &str) -> String {
    format!("{}/lib{name}.so", env!("OXCCL_FIXTURES"))
}

fn spawn_with(name: &str, env: &[(&str, &str)]) -> Vec<oxccl_cli::launch::Finished> {
    let done = spawn(name, 2, env, Duration::from_secs(60));
    assert_all_ok(&done);
    done
}

#[test]
fn old_version_library_loads_at_that_version() {
    let name = "old_version_library_loads_at_that_version";
    // The fixture has no devices, so the built-in network carries the run.
    if as_child(name, body("Socket")) {
        return;
    }
    let lib = fixture("net_v8_nodev");
    let done = spawn_with(
        name,
        &[
            ("NCCL_NET_PLUGIN", &lib),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_SUBSYS", "NET"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!(
                "loaded net plugin fixture-v8 from {lib} (ncclNetPlugin_v8)"
            )),
            "rank {}:\n{e}",
            f.rank
        );
        // printf-style arguments formatted by the logger shim.
        assert!(e.contains("fixture net v8 up (8)"), "rank {}:\n{e}", f.rank);
        assert!(
            e.contains("collnet plugin in")
                && e.contains("(ncclCollNetPlugin_v8): used for all_reduce on host memory where NCCL_COLLNET_ENABLE=1"),
            "rank {}:\n{e}",
            f.rank
        );
        assert!(e.contains("0 device(s)"), "rank {}:\n{e}", f.rank);
    }
}

#[test]
fn broken_libraries_give_one_warning_and_the_builtin_network() {
    let name = "broken_libraries_give_one_warning_and_the_builtin_network";
    if as_child(name, body("Socket")) {
        return;
    }
    for (lib, found, reason) in [
        (
            "net_null",
            "found ncclNetPlugin_v10;",
            "ncclNetPlugin_v10 has NULL isend",
        ),
        (
            "net_initfail",
            "found ncclNetPlugin_v11;",
            "ncclNetPlugin_v11 init failed: internal error: plugin init returned ncclInternalError (3)",
        ),
    ] {
        let path = fixture(lib);
        let done = spawn_with(name, &[("NCCL_NET_PLUGIN", &path), ("NCCL_DEBUG", "WARN")]);
        for f in &done {
            let lines: Vec<&str> = f.stderr.lines().filter(|l| l.contains(&path)).collect();
            assert_eq!(lines.len(), 1, "rank {}:\n{}", f.rank, f.stderr);
            let l = lines[0];
            assert!(
                l.contains("WARN")
                    && l.contains("looked for ncclNetPlugin_v12, ncclNetPlugin_v11")
                    && l.contains(found)
                    && l.contains(reason)
                    && l.contains("using the built-in network"),
                "rank {}: {l}",
                f.rank
            );
        }
    }
}

#[test]
fn tuner_changes_the_algorithm_used() {
    let name = "tuner_changes_the_algorithm_used";
    if as_child(name, body("Socket")) {
        return;
    }
    let lib = fixture("tuner_ring");
    let done = spawn_with(
        name,
        &[
            ("NCCL_TUNER_PLUGIN", &lib),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_SUBSYS", "TUNING"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!(
                "loaded tuner plugin fixture-ring from {lib} (ncclTunerPlugin_v3)"
            )),
            "rank {}:\n{e}",
            f.rank
        );
        assert!(e.contains("fixture tuner for 2 ranks on 1 node(s)"), "{e}");
        // On 2 ranks the model picks recursive doubling at every size;
        // the tuner's table makes ring cheapest, and ring runs.
        let decisions: Vec<&str> = e
            .lines()
            .filter(|l| l.contains("tuner fixture-ring: all_reduce of"))
            .collect();
        assert_eq!(decisions.len(), 2, "one per size bucket:\n{e}");
        for d in decisions {
            assert!(
                d.contains("-> Ring (NCCL row 1, protocol SIMPLE")
                    && d.contains("the model alone chose RecDoubling"),
                "{d}"
            );
        }
    }
}

/// The profiler tests' workload on 2 ranks: `n` all-reduces, then one
/// group of a send to and a receive from the other rank.
fn all_reduces_then_a_send_recv_group(r: oxccl_tests::Rank, n: usize) {
    let comm = r.comm(&[]);
    let mut buf = vec![0u8; 4096];
    for _ in 0..n {
        comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
            .unwrap();
    }
    let peer = 1 - r.rank;
    let out = vec![1u8; 64];
    let mut inp = vec![0u8; 64];
    let mut g = oxccl::Group::new();
    g.send(&comm, &out, DataType::Uint8, peer).unwrap();
    g.recv(&comm, &mut inp, DataType::Uint8, peer).unwrap();
    g.run().unwrap();
    comm.destroy().unwrap();
}

#[test]
fn profiler_sees_one_collective_event_per_collective() {
    let name = "profiler_sees_one_collective_event_per_collective";
    if as_child(name, |r| all_reduces_then_a_send_recv_group(r, 3)) {
        return;
    }
    let lib = fixture("profiler_count");
    let done = spawn_with(name, &[("NCCL_PROFILER_PLUGIN", &lib)]);
    for f in &done {
        let count = |s: &str| f.stderr.lines().filter(|l| l.starts_with(s)).count();
        let e = &f.stderr;
        let me = format!("fixture-profiler start coll rank={} func=AllReduce", f.rank);
        assert_eq!(count(&me), 3, "rank {}:\n{e}", f.rank);
        assert_eq!(count("fixture-profiler stop coll"), 3, "{e}");
        // Every collective's parentGroup is its group event (v5: the
        // parent itself is the collective's API event).
        assert!(!e.contains("parent=?"), "{e}");
        // Three collective groups and one p2p group.
        assert_eq!(count("fixture-profiler start group"), 4, "{e}");
        assert_eq!(count("fixture-profiler stop group"), 4, "{e}");
        // NCCL's rule: asking for group and collective events starts the
        // API events above them too (a group API event per group, a
        // collective API event per collective), but no p2p API events.
        assert_eq!(count("fixture-profiler start other type=256"), 4, "{e}");
        assert_eq!(count("fixture-profiler start other type=512"), 3, "{e}");
        assert_eq!(count("fixture-profiler start other"), 7, "{e}");
    }
}

/// The complete events of `rank`'s trace in `dir`, by id.
#[test]
fn our_profiler_nests_proxy_ops_and_steps_under_operations() {
    let name = "our_profiler_nests_proxy_ops_and_steps_under_operations";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        // Several slices per channel: 256 KiB with 16 KiB chunks.
        let mut buf = vec![0u8; 256 << 10];
        comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
            .unwrap();
        let (next, prev) = ((r.rank + 1) % r.nranks, (r.rank + r.nranks - 1) % r.nranks);
        let out = vec![1u8; 40 << 10];
        let mut inp = vec![0u8; 40 << 10];
        let mut g = oxccl::Group::new();
        g.send(&comm, &out, DataType::Uint8, next).unwrap();
        g.recv(&comm, &mut inp, DataType::Uint8, prev).unwrap();
        g.run().unwrap();
        comm.destroy().unwrap();
    }) {
        return;
    }
    let lib = built_library("liboxccl_profiler.so")
        .expect("liboxccl_profiler.so next to the test binary (a dev-dependency builds it)");
    let lib = lib.to_string_lossy().into_owned();
    // 0x1f: group, coll, p2p, proxy op, proxy step; 7 lacks the proxy bits.
    for (mask, proxy) in [("0x1f", true), ("7", false)] {
        let dir =
            std::env::temp_dir().join(format!("oxccl-prof-proxy-{}-{mask}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_string_lossy().into_owned();
        let done = spawn(
            name,
            3,
            &[
                ("NCCL_PROFILER_PLUGIN", &lib),
                ("NCCL_PROFILE_EVENT_MASK", mask),
                ("OXCCL_PROFILER_DIR", &d),
                ("NCCL_CHUNK_SIZE", "16K"),
                // The network path, where NCCL records proxy events (the direct
                // path's mailbox copies have none, as NCCL's shared memory has none).
                ("NCCL_SHM_DISABLE", "1"),
            ],
            Duration::from_secs(60),
        );
        assert_all_ok(&done);
        for rank in 0..3 {
            let xs = trace_events(&dir, rank);
            let by_id: std::collections::HashMap<u64, &serde_json::Value> = xs
                .iter()
                .map(|e| (e["args"]["id"].as_u64().unwrap(), e))
                .collect();
            let named = |n: &str| xs.iter().filter(|e| e["name"] == n).count();
            assert_eq!(named("AllReduce"), 1, "rank {rank}: {xs:?}");
            assert_eq!(named("Send") + named("Recv"), 2, "rank {rank}");
            let ops: Vec<_> = xs
                .iter()
                .filter(|e| e["name"] == "ProxySend" || e["name"] == "ProxyRecv")
                .collect();
            let steps: Vec<_> = xs.iter().filter(|e| e["name"] == "ProxyStep").collect();
            if !proxy {
                assert!(ops.is_empty() && steps.is_empty(), "mask {mask}: {xs:?}");
                assert!(xs.iter().all(|e| e["cat"] != "proxy"), "mask {mask}");
                continue;
            }
            let parent_of = |e: &serde_json::Value| -> &serde_json::Value {
                let p = e["args"]["parent"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("rank {rank}: no parent: {e}"));
                by_id[&p]
            };
            // A child lies within its parent's time (microseconds, with
            // rounding room).
            let inside = |c: &serde_json::Value, p: &serde_json::Value| {
                let (cs, cd) = (c["ts"].as_f64().unwrap(), c["dur"].as_f64().unwrap());
                let (ps, pd) = (p["ts"].as_f64().unwrap(), p["dur"].as_f64().unwrap());
                assert!(
                    cs >= ps - 0.01 && cs + cd <= ps + pd + 0.01,
                    "rank {rank}: {c} is not within {p}"
                );
            };
            let mut under = std::collections::HashMap::new();
            for op in &ops {
                let parent = parent_of(op);
                inside(op, parent);
                *under
                    .entry(parent["name"].as_str().unwrap().to_string())
                    .or_insert(0) += 1;
                assert_eq!(op["pid"], rank as u64);
                // Its steps: as many as it announced, numbered from 0.
                let id = op["args"]["id"].as_u64().unwrap();
                let mut mine: Vec<u64> = steps
                    .iter()
                    .filter(|s| s["args"]["parent"].as_u64() == Some(id))
                    .map(|s| {
                        inside(s, op);
                        s["args"]["step"].as_u64().unwrap()
                    })
                    .collect();
                mine.sort_unstable();
                let n = op["args"]["step"].as_u64().unwrap();
                assert!(n > 0, "{op}");
                assert_eq!(
                    mine,
                    (0..n).collect::<Vec<_>>(),
                    "rank {rank}: steps of {op}"
                );
            }
            assert!(steps.iter().all(|s| parent_of(s)["cat"] == "proxy"));
            assert!(
                under.get("AllReduce").copied().unwrap_or(0) >= 2,
                "{under:?}"
            );
            assert_eq!(under.get("Send"), Some(&1), "{under:?}");
            assert_eq!(under.get("Recv"), Some(&1), "{under:?}");
            assert!(ops.iter().any(|o| o["name"] == "ProxySend"));
            assert!(ops.iter().any(|o| o["name"] == "ProxyRecv"));
            // The operations themselves hang under their group.
            for e in xs
                .iter()
                .filter(|e| e["cat"] == "coll" || e["cat"] == "p2p")
            {
                let g = parent_of(e);
                assert_eq!(g["name"], "Group", "{e}");
                inside(e, g);
            }
        }
        // OXCCL_KEEP_TRACES=1 keeps them to open in a viewer.
        if std::env::var_os("OXCCL_KEEP_TRACES").is_none() {
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}

#[test]
fn profiler_v1_gets_enum_codes() {
    let name = "profiler_v1_gets_enum_codes";
    if as_child(name, |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        let mut buf = vec![0u8; 4096];
        for _ in 0..2 {
            comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Max)
                .unwrap();
        }
        comm.destroy().unwrap();
    }) {
        return;
    }
    let lib = fixture("profiler_v1");
    let done = spawn_with(
        name,
        &[
            ("NCCL_PROFILER_PLUGIN", &lib),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_SUBSYS", "PROFILER"),
            // The ranks share a host: without this the direct path, which
            // NCCL's enums have no code for (-1), would take the calls.
            ("OXCCL_HOST_DIRECT", "0"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!(
                "loaded profiler plugin fixture-v1 from {lib} (ncclProfiler_v1)"
            )),
            "{e}"
        );
        // ncclAllReduce = 4, ncclFloat32 = 7, ncclMax = 2, SIMPLE = 2; on
        // two ranks the model picks recursive doubling: NCCL_ALGO_TREE = 0.
        let starts = e
            .lines()
            .filter(|l| *l == "fixture-profiler-v1 start coll func=4 dtype=7 op=2 algo=0 proto=2")
            .count();
        assert_eq!(starts, 2, "{e}");
        assert_eq!(e.matches("fixture-profiler-v1 stop coll").count(), 2, "{e}");
        // Asking for collectives starts their group events too (NCCL's
        // rule: a wanted event has its parents); nothing else is started.
        let others: Vec<&str> = e.lines().filter(|l| l.contains("start other")).collect();
        assert!(
            others
                .iter()
                .all(|l| *l == "fixture-profiler-v1 start other type=1"),
            "{e}"
        );
        assert_eq!(others.len(), 2, "{e}");
    }
}

#[test]
fn tuner_is_found_inside_the_net_plugin_library() {
    let name = "tuner_is_found_inside_the_net_plugin_library";
    if as_child(name, body("Socket")) {
        return;
    }
    let lib = fixture("net_with_tuner");
    let done = spawn_with(
        name,
        &[
            ("NCCL_NET_PLUGIN", &lib),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_SUBSYS", "TUNING,NET"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!("loaded net plugin fixture-v8 from {lib}")),
            "{e}"
        );
        assert!(
            e.contains(&format!(
                "loaded tuner plugin fixture-ring from {lib} (ncclTunerPlugin_v3)"
            )),
            "{e}"
        );
        assert!(e.contains("-> Ring (NCCL row 1"), "{e}");
    }
}

/// The IB plugin's data path over a soft-RoCE device, where one exists or
/// can be made (`rdma link add oxccl_rxe0 type rxe netdev <if>`, as root,
/// removed afterwards); everywhere else it says why it skipped.
#[test]
fn ib_plugin_runs_collectives_over_soft_roce_where_available() {
    let name = "ib_plugin_runs_collectives_over_soft_roce_where_available";
    if as_child(name, body("oxccl-IB")) {
        return;
    }
    let Some(p) = built_library("liboxccl_net_ib.so") else {
        println!("skipped: liboxccl_net_ib.so was not built beside the tests");
        return;
    };
    let has_rxe = || {
        std::fs::read_dir("/sys/class/infiniband")
            .map(|d| {
                d.flatten().any(|e| {
                    e.file_name().to_string_lossy().starts_with("rxe")
                        || e.file_name().to_string_lossy().starts_with("oxccl_rxe")
                })
            })
            .unwrap_or(false)
    };
    let mut made = false;
    if !has_rxe() {
        // Any non-loopback interface will do for a device on one host.
        let netdev = std::fs::read_dir("/sys/class/net").ok().and_then(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n != "lo")
        });
        let created = netdev.as_deref().is_some_and(|nd| {
            std::process::Command::new("rdma")
                .args(["link", "add", "oxccl_rxe0", "type", "rxe", "netdev", nd])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        if !created {
            println!("skipped: no soft-RoCE device and none could be made (`rdma link add ... type rxe` failed or the rdma tool is missing)");
            return;
        }
        made = true;
    }
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_NET_PLUGIN", p.to_str().unwrap()),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_SHM_DISABLE", "1"),
        ],
        Duration::from_secs(60),
    );
    if made {
        let _ = std::process::Command::new("rdma")
            .args(["link", "delete", "oxccl_rxe0"])
            .status();
    }
    assert_all_ok(&done);
}

/// What `init` hands a plugin that NCCL keeps for the communicator's life
/// stays valid until the plugin's `finalize`: the profiler's `commName`
/// (NCCL's example profiler stores it at init and prints it at finalize)
/// and the tuner's `nvlDomainInfo` and `constants` (fields of NCCL's
/// communicator). The fixtures keep the pointers and compare the bytes
/// behind them at finalize with copies made at init, after collectives and
/// a destroy have churned the heap.
#[test]
fn pointers_given_at_init_stay_valid_until_finalize() {
    let name = "pointers_given_at_init_stay_valid_until_finalize";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        for size in [8usize, 1 << 20] {
            let mut buf = vec![0u8; size];
            comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
                .unwrap();
        }
        comm.destroy().unwrap();
    }) {
        return;
    }
    let (prof, tuner) = (fixture("profiler_keep_name"), fixture("tuner_keep"));
    let done = spawn_with(
        name,
        &[
            ("NCCL_PROFILER_PLUGIN", &prof),
            ("NCCL_TUNER_PLUGIN", &tuner),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        let line = |prefix: &str| -> Vec<&str> {
            e.lines()
                .filter(|l| l.starts_with(prefix))
                .collect::<Vec<_>>()
        };
        let init = line("fixture-keep-name init");
        let fin = line("fixture-keep-name finalize");
        assert_eq!((init.len(), fin.len()), (1, 1), "rank {}:\n{e}", f.rank);
        // The name is oxccl's for the communicator, the same at both ends.
        let name_at = |l: &str| {
            l.split("name=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert!(name_at(init[0]).starts_with("oxccl-"), "{}", init[0]);
        assert_eq!(name_at(init[0]), name_at(fin[0]));
        assert!(fin[0].ends_with("intact=1"), "rank {}: {}", f.rank, fin[0]);
        let t = line("fixture-tuner-keep finalize");
        assert_eq!(
            t,
            ["fixture-tuner-keep finalize nvl_intact=1 constants_intact=1"],
            "rank {}:\n{e}",
            f.rank
        );
    }
}

/// NCCL's v5 event tree on host memory (profiler_v5.h, plugins/profiler/
/// README.md, src/plugin/profiler.cc): a group API event per outermost
/// group (depth 1 for a lone call, 2 in an explicit group) with the states
/// GroupStartApiStop (23) then GroupEndApiStart (24); under it a collective
/// or p2p API event per call, stopped when the call returns; the executed
/// group event (no parent); each collective's event with its API event as
/// parent and the group as parentGroup, likewise each p2p. The activation
/// mask starts an event when its bit or the bit of an event below it is
/// set; kernel launches only happen on GPUs (none here).
#[test]
fn profiler_v5_api_event_tree_follows_nccl() {
    let name = "profiler_v5_api_event_tree_follows_nccl";
    if as_child(name, |r| all_reduces_then_a_send_recv_group(r, 2)) {
        return;
    }
    let lib = fixture("profiler_tree");
    // GroupApi | CollApi | P2pApi | KernelLaunch | Group | Coll | P2p
    let all = format!("{}", 256 | 512 | 1024 | 2048 | 1 | 2 | 4);
    for (mask, want) in [
        // (GroupApi, CollApi, P2pApi, Group, Coll, P2p) per rank
        (all.as_str(), [3, 2, 2, 3, 2, 2]),
        // Collectives only: their API and group events come with them.
        ("2", [3, 2, 0, 3, 2, 0]),
        // Point-to-point only.
        ("4", [3, 0, 2, 3, 0, 2]),
        // API events alone: no execution events.
        ("256", [3, 0, 0, 0, 0, 0]),
        ("0", [0, 0, 0, 0, 0, 0]),
    ] {
        let done = spawn_with(
            name,
            &[
                ("NCCL_PROFILER_PLUGIN", &lib),
                ("FIXTURE_PROFILER_MASK", mask),
            ],
        );
        for f in &done {
            let evs = tree_of(&f.stderr);
            let of = |k: &str| {
                evs.values()
                    .filter(|e| e.kind == k)
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let kinds = ["GroupApi", "CollApi", "P2pApi", "Group", "Coll", "P2p"];
            let got: Vec<usize> = kinds.iter().map(|k| of(k).len()).collect();
            assert_eq!(
                got, want,
                "mask {mask}, rank {}: {kinds:?}\n{}",
                f.rank, f.stderr
            );
            assert!(of("KernelLaunch").is_empty() && of("Other").is_empty());
            for e in evs.values() {
                assert!(e.stopped_at.is_some(), "mask {mask}: never stopped: {e:?}");
                assert_eq!(e.fields["rank"], f.rank.to_string(), "{e:?}");
            }
            let by_id = |id: i64| {
                evs.get(&(id as u64))
                    .unwrap_or_else(|| panic!("no event {id}"))
            };
            // Group API events: roots, depth 1, 1, 2, states 23 then 24,
            // stopped after everything under them.
            let depths: Vec<String> = of("GroupApi")
                .iter()
                .map(|e| e.fields["depth"].clone())
                .collect();
            if !depths.is_empty() {
                assert_eq!(depths, ["1", "1", "2"], "mask {mask}");
            }
            for g in of("GroupApi") {
                assert_eq!(g.parent, 0, "{g:?}");
                assert_eq!(g.states, [23, 24], "{g:?}");
            }
            for a in of("CollApi").iter().chain(of("P2pApi").iter()) {
                let g = by_id(a.parent);
                assert_eq!(g.kind, "GroupApi", "{a:?}");
                // The API call is over before its group ends.
                assert!(a.stopped_at < g.stopped_at, "{a:?} {g:?}");
            }
            for a in of("CollApi") {
                assert_eq!(
                    (
                        a.fields["func"].as_str(),
                        a.fields["count"].as_str(),
                        a.fields["dtype"].as_str()
                    ),
                    ("AllReduce", "1024", "ncclFloat32"),
                    "{a:?}"
                );
                assert_eq!(by_id(a.parent).fields["depth"], "1", "{a:?}");
            }
            let mut p2p_api_funcs: Vec<&str> = Vec::new();
            let p2p_apis = of("P2pApi");
            for a in &p2p_apis {
                p2p_api_funcs.push(a.fields["func"].as_str());
                assert_eq!(by_id(a.parent).fields["depth"], "2", "{a:?}");
            }
            if !p2p_apis.is_empty() {
                assert_eq!(p2p_api_funcs, ["Send", "Recv"], "mask {mask}");
            }
            for g in of("Group") {
                assert_eq!(g.parent, 0, "{g:?}");
            }
            for (c, api) in [("Coll", "CollApi"), ("P2p", "P2pApi")] {
                for e in of(c) {
                    let a = by_id(e.parent);
                    assert_eq!(a.kind, api, "mask {mask}: {e:?}");
                    assert_eq!(a.fields["func"], e.fields["func"], "{e:?} under {a:?}");
                    assert_eq!(a.fields["count"], e.fields["count"], "{e:?} under {a:?}");
                    let g = by_id(e.fields["group"].parse().unwrap());
                    assert_eq!(g.kind, "Group", "{e:?}");
                    // Executed after the call returned, inside its group.
                    assert!(e.started_at > a.stopped_at.unwrap() && e.stopped_at < g.stopped_at);
                }
            }
        }
    }
}

/// Every collective, rooted at rank 1, at a small and an odd large size,
/// checked on random data; the network must be `expect_net`.
fn every_collective(expect_net: &str) -> impl FnOnce(oxccl_tests::Rank) + '_ {
    move |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        assert_eq!(comm.net_name().unwrap(), expect_net);
        oxccl_tests::check_every_collective(&comm, 1, &[8, (1 << 20) + 12]);
    }
}

/// A net plugin of an old ABI carrying every collective: the fixture
/// exports only `ncclNetPlugin_v{version}` and passes each call on to the
/// socket net's `ncclNetPlugin_v8` (converting properties and sizes), so
/// the traffic really goes through oxccl's v6/v7 adapter; it counts what
/// it sent and logs the count as each send comm closes.
fn old_abi_carries_collectives(name: &str, version: u32) {
    let Some(inner) = plugin_path() else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let lib = fixture(&format!("net_v{version}_shim"));
    let done = spawn_with(
        name,
        &[
            ("NCCL_NET_PLUGIN", &lib),
            ("FIXTURE_INNER_NET", inner.to_str().unwrap()),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!(
                "loaded net plugin fixture-v{version} from {lib} (ncclNetPlugin_v{version})"
            )),
            "rank {}:\n{e}",
            f.rank
        );
        assert!(e.contains("fixture net shim over oxccl-Socket"), "{e}");
        // Each rank sends at least its half of a 1 MiB all-reduce.
        let bytes: u64 = e
            .lines()
            .filter_map(|l| l.split("fixture net shim closes a send comm after ").nth(1))
            .filter_map(|l| l.split(", ").nth(1)?.strip_suffix(" bytes")?.parse().ok())
            .max()
            .unwrap_or_else(|| {
                panic!(
                    "rank {}: no send comm closed through the shim:\n{e}",
                    f.rank
                )
            });
        assert!(
            bytes >= 1 << 19,
            "rank {}: {bytes} bytes through the shim",
            f.rank
        );
    }
}

#[test]
fn net_v7_plugin_carries_collectives() {
    let name = "net_v7_plugin_carries_collectives";
    if as_child(name, every_collective("fixture-v7")) {
        return;
    }
    old_abi_carries_collectives(name, 7);
}

#[test]
fn net_v6_plugin_carries_collectives() {
    let name = "net_v6_plugin_carries_collectives";
    if as_child(name, every_collective("fixture-v6")) {
        return;
    }
    old_abi_carries_collectives(name, 6);
}

/// A plugin whose `init` succeeds with no context (NCCL's Inspector, where
/// it finds no CUDA driver) gets no `finalize`, as NCCL gives none for a
/// NULL context (profiler.cc); oxccl called it, and the Inspector crashed
/// there (tools/nccl_profilers.sh, 2 ranks on host memory: SIGSEGV).
#[test]
fn profiler_with_no_context_is_not_finalized() {
    let name = "profiler_with_no_context_is_not_finalized";
    if as_child(name, |r| all_reduces_then_a_send_recv_group(r, 2)) {
        return;
    }
    let done = spawn_with(
        name,
        &[("NCCL_PROFILER_PLUGIN", &fixture("profiler_null_ctx"))],
    );
    for f in &done {
        assert!(
            f.stderr
                .contains(&format!("fixture-null-ctx init rank={}", f.rank)),
            "{}",
            f.stderr
        );
        assert!(!f.stderr.contains("finalize called"), "{}", f.stderr);
    }
}

/// NCCL's proxy-control events (proxy.cc, profiler.cc), asked for alone
/// (mask 32): each a root event of type ProxyCtrl with rank 0 and no
/// parent, holding one of NCCL's state sequences: idle (13) or active
/// (14), sleep then wakeup (15, 16), append then append-end (17, 18) with
/// the proxy ops taken on; one append per network call (each lane's peers
/// in each direction, 2 for 2 ranks), and nothing else started (whether a
/// pass finds nothing to do, an idle, depends on timing). With the
/// proxy-step bit alone (mask 16) there are none.
#[test]
fn profiler_proxy_control_events_follow_nccl() {
    let name = "profiler_proxy_control_events_follow_nccl";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        let mut buf = vec![0u8; 64 << 10];
        for _ in 0..3 {
            comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
                .unwrap();
        }
        comm.destroy().unwrap();
    }) {
        return;
    }
    for mask in ["32", "16"] {
        let done = spawn_with(
            name,
            &[
                ("NCCL_PROFILER_PLUGIN", &fixture("profiler_tree")),
                ("FIXTURE_PROFILER_MASK", mask),
                ("NCCL_SHM_DISABLE", "1"),
            ],
        );
        for f in &done {
            let evs = tree_of(&f.stderr);
            let ctrl: Vec<&TreeEvent> = evs.values().filter(|e| e.kind == "ProxyCtrl").collect();
            if mask == "16" {
                assert!(ctrl.is_empty(), "rank {}: {ctrl:?}", f.rank);
                continue;
            }
            assert_eq!(ctrl.len(), evs.len(), "rank {}: only ProxyCtrl", f.rank);
            for e in &ctrl {
                assert_eq!((e.parent, e.fields["rank"].as_str()), (0, "0"), "{e:?}");
                assert!(e.stopped_at.is_some(), "{e:?}");
                let ok: [&[i32]; 4] = [&[13], &[14], &[15, 16], &[17, 18]];
                assert!(ok.contains(&e.states.as_slice()), "rank {}: {e:?}", f.rank);
            }
            let appended: Vec<i32> = f
                .stderr
                .lines()
                .filter_map(|l| l.strip_prefix("tree appended "))
                .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
                .collect();
            assert_eq!(appended, [2, 2, 2], "rank {}", f.rank);
        }
    }
}

/// NCCL's proxy events under its v5 model (profiler_v5.h, src/transport/
/// net.cc, src/plugin/profiler.cc), asked for with the ProxyStep bit alone
/// (which starts every event above it): a proxy op per (operation, peer,
/// direction, channel), child of the collective or p2p event, with the one
/// state v4 and later get ("in progress", 19) before its first step, and
/// stopped after its last step; its steps numbered from 0, as many as it
/// announced; a send step goes GPU wait (8), peer wait (20), send wait (9),
/// a receive step recv wait (10), flush wait (11), GPU wait (12), each then
/// stopped; none of the v1-v3 proxy-op states (0-7).
#[test]
fn profiler_v5_proxy_events_follow_nccl() {
    let name = "profiler_v5_proxy_events_follow_nccl";
    if as_child(name, |r| {
        let comm = r.comm(&[]);
        // 64 KiB: the rings (above the inline and below the direct path).
        let mut buf = vec![0u8; 64 << 10];
        comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
            .unwrap();
        let peer = 1 - r.rank;
        let out = vec![1u8; 64 << 10];
        let mut inp = vec![0u8; 64 << 10];
        let mut g = oxccl::Group::new();
        g.send(&comm, &out, DataType::Uint8, peer).unwrap();
        g.recv(&comm, &mut inp, DataType::Uint8, peer).unwrap();
        g.run().unwrap();
        comm.destroy().unwrap();
    }) {
        return;
    }
    let done = spawn_with(
        name,
        &[
            ("NCCL_PROFILER_PLUGIN", &fixture("profiler_tree")),
            ("FIXTURE_PROFILER_MASK", "16"),
            ("NCCL_CHUNK_SIZE", "16K"),
            // The network path, where NCCL records proxy events (the direct
            // path's mailbox copies have none, as NCCL's shared memory has none).
            ("NCCL_SHM_DISABLE", "1"),
        ],
    );
    for f in &done {
        let evs = tree_of(&f.stderr);
        let ops: Vec<(&u64, &TreeEvent)> =
            evs.iter().filter(|(_, e)| e.kind == "ProxyOp").collect();
        let mut under = std::collections::BTreeMap::new();
        for (id, op) in &ops {
            let parent = &evs[&(op.parent as u64)];
            *under.entry(parent.kind.as_str()).or_insert(0) += 1;
            assert_eq!(op.states, [19], "rank {}: {op:?}", f.rank);
            assert_eq!(op.fields["peer"], (1 - f.rank).to_string(), "{op:?}");
            let send = op.fields["send"] == "1";
            let steps: Vec<&TreeEvent> = evs
                .values()
                .filter(|s| s.kind == "ProxyStep" && s.parent == **id as i64)
                .collect();
            let numbers: Vec<String> = steps.iter().map(|s| s.fields["step"].clone()).collect();
            let n: usize = op.fields["steps"].parse().unwrap();
            assert!(n > 1, "several slices per op at 16 KiB chunks: {op:?}");
            let want: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            assert_eq!(numbers, want, "rank {}: steps of {op:?}", f.rank);
            for s in steps {
                let order: &[i32] = if send { &[8, 20, 9] } else { &[10, 11, 12] };
                assert_eq!(s.states, order, "rank {}: {s:?}", f.rank);
                assert!(s.started_at > op.started_at && s.stopped_at < op.stopped_at);
            }
            assert!(op.stopped_at.is_some() && parent.stopped_at > op.stopped_at);
        }
        assert!(
            under.get("Coll").is_some_and(|&n| n >= 2),
            "rank {}: {under:?}",
            f.rank
        );
        assert_eq!(under.get("P2p"), Some(&2), "rank {}: {under:?}", f.rank);
    }
}

/// Network events through the net plugin's profiler callback, as NCCL
/// defines them (src/plugin/profiler.cc's ncclProfilerCallback, src/
/// transport/net_socket.cc): with NCCL_PROFILE_NET_PLUGIN (128) in the
/// mask, the socket network reports one event per socket transfer (the
/// control socket's inline message, or each stripe of a large one on a
/// data socket), id NCCL_PROFILER_NET_TYPE_SOCK | 1 with NCCL's socket
/// descriptor (type ncclProfileSocket, fd, op 0 send / 1 receive, length),
/// each a child of the proxy step that posted the operation, on the same
/// rank, started and stopped inside it. Every step has at least one. With
/// the mask lacking the bit there are none. Returns (steps, net events)
/// per rank, the counts recorded on 2026-11-25 (3bc2679).
fn net_plugin_events(name: &str, env: &[(&str, &str)], mask: i32) -> Vec<(usize, usize)> {
    let (mask_s, lib) = (mask.to_string(), fixture("profiler_tree"));
    let mut vars: Vec<(&str, &str)> = vec![
        ("NCCL_PROFILER_PLUGIN", &lib),
        ("FIXTURE_PROFILER_MASK", &mask_s),
        // The network path, where NCCL has proxy steps.
        ("NCCL_SHM_DISABLE", "1"),
    ];
    vars.extend_from_slice(env);
    let done = spawn_with(name, &vars);
    let mut counts = Vec::new();
    for f in &done {
        let evs = tree_of(&f.stderr);
        let net: Vec<&TreeEvent> = evs.values().filter(|e| e.kind == "NetPlugin").collect();
        let steps: Vec<(&u64, &TreeEvent)> =
            evs.iter().filter(|(_, e)| e.kind == "ProxyStep").collect();
        assert!(!steps.is_empty(), "rank {}: no proxy steps", f.rank);
        if mask & 128 == 0 {
            assert!(net.is_empty(), "mask {mask}, rank {}: {net:?}", f.rank);
            counts.push((steps.len(), 0));
            continue;
        }
        for e in &net {
            let step = &evs[&(e.parent as u64)];
            assert_eq!(step.kind, "ProxyStep", "rank {}: {e:?}", f.rank);
            let rank = f.rank.to_string();
            assert_eq!((&e.fields["rank"], &step.fields["rank"]), (&rank, &rank));
            assert_eq!(e.fields["id"], "0x20001", "{e:?}");
            assert_eq!(e.fields["sock_type"], "1", "{e:?}");
            assert!(e.fields["fd"].parse::<i32>().unwrap() > 0, "{e:?}");
            assert!(e.fields["length"].parse::<usize>().unwrap() > 0, "{e:?}");
            let op = &evs[&(step.parent as u64)];
            let want_op = if op.fields["send"] == "1" { "0" } else { "1" };
            assert_eq!(e.fields["op"], want_op, "{e:?} under {op:?}");
            assert!(
                e.started_at > step.started_at && e.stopped_at.is_some(),
                "{e:?} in {step:?}"
            );
            assert!(e.stopped_at < step.stopped_at, "{e:?} in {step:?}");
        }
        for (id, s) in &steps {
            assert!(
                net.iter().any(|e| e.parent == **id as i64),
                "rank {}: a step without a socket event: {s:?}",
                f.rank
            );
        }
        if f.rank == 0 {
            let mut lens: Vec<String> = net
                .iter()
                .map(|e| format!("{}:{}", e.fields["op"], e.fields["length"]))
                .collect();
            lens.sort();
            lens.dedup();
            println!("mask {mask}, rank 0 socket events (op:length): {lens:?}");
        }
        counts.push((steps.len(), net.len()));
    }
    counts
}

/// Sizes that travel inline on the control socket and one that is striped
/// over data sockets (when the network has helper threads).
fn all_reduces_small_and_large(r: oxccl_tests::Rank) {
    let comm = r.comm(&[]);
    for size in [64usize << 10, 1 << 20] {
        let mut buf = vec![0u8; size];
        comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
            .unwrap();
    }
    comm.destroy().unwrap();
}

#[test]
fn net_plugin_events_of_the_builtin_socket_net_follow_nccl() {
    let name = "net_plugin_events_of_the_builtin_socket_net_follow_nccl";
    if as_child(name, all_reduces_small_and_large) {
        return;
    }
    let inline = net_plugin_events(name, &[], 16 | 128);
    // Helper threads: large messages go in stripes over data sockets.
    let striped = net_plugin_events(
        name,
        &[
            ("NCCL_SOCKET_NTHREADS", "2"),
            ("NCCL_NSOCKS_PERTHREAD", "2"),
        ],
        16 | 128,
    );
    let none = net_plugin_events(name, &[], 8 | 16);
    println!("built-in socket net, (steps, net events) per rank: inline {inline:?}, striped {striped:?}, without the bit {none:?}");
    for ((s, n), (s2, n2)) in inline.iter().zip(&striped) {
        // Inline: one event per step; striped: more for the large steps.
        assert_eq!(s, n, "inline: one socket event per step");
        assert!(n2 > s2, "striped: several socket events per large step");
    }
}

#[test]
fn net_plugin_events_of_the_socket_plugin_library_follow_nccl() {
    let name = "net_plugin_events_of_the_socket_plugin_library_follow_nccl";
    if as_child(name, all_reduces_small_and_large) {
        return;
    }
    let Some(p) = plugin_path() else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let lib = p.to_str().unwrap();
    let env = [
        ("NCCL_NET_PLUGIN", lib),
        ("NCCL_SOCKET_NTHREADS", "2"),
        ("NCCL_NSOCKS_PERTHREAD", "2"),
    ];
    let got = net_plugin_events(name, &env, 16 | 128);
    let none = net_plugin_events(name, &env, 8 | 16);
    println!(
        "socket plugin library, (steps, net events) per rank: {got:?}, without the bit {none:?}"
    );
    for (s, n) in &got {
        assert!(n > s, "striped: several socket events per large step");
    }
}

/// The profiler handle oxccl passes with each isend/irecv stays valid as
/// long as the ABI promises, and events a plugin stops late still reach
/// the right event: the v10 fixture shim (tests/fixtures/
/// net_v10_prof_shim.c, over the socket plugin) starts event A with the
/// handle in isend/irecv and event B with it inside the test() that finds
/// the request done, then stops both only at its next call after that
/// test() (A with UpdateAndStop carrying the size), when oxccl may have
/// ended the step and dropped the task. Every step gets exactly A and B,
/// both children of it; A's one state is the update (21) with the size;
/// each is stopped once (tree_of refuses a second stop). Without the
/// NetPlugin bit the shim gets no handle and nothing is reported.
#[test]
fn net_plugin_profiler_handles_outlive_their_requests() {
    let name = "net_plugin_profiler_handles_outlive_their_requests";
    if as_child(name, every_collective("fixture-prof-shim")) {
        return;
    }
    let Some(inner) = plugin_path() else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let (shim, prof) = (fixture("net_v10_prof_shim"), fixture("profiler_tree"));
    for mask in ["144", "16"] {
        let done = spawn_with(
            name,
            &[
                ("NCCL_NET_PLUGIN", &shim),
                ("FIXTURE_INNER_NET", inner.to_str().unwrap()),
                ("NCCL_PROFILER_PLUGIN", &prof),
                ("FIXTURE_PROFILER_MASK", mask),
                ("NCCL_SHM_DISABLE", "1"),
            ],
        );
        for f in &done {
            let evs = tree_of(&f.stderr);
            let net: Vec<(&u64, &TreeEvent)> =
                evs.iter().filter(|(_, e)| e.kind == "NetPlugin").collect();
            let steps: Vec<(&u64, &TreeEvent)> =
                evs.iter().filter(|(_, e)| e.kind == "ProxyStep").collect();
            assert!(!steps.is_empty(), "rank {}", f.rank);
            if mask == "16" {
                assert!(net.is_empty(), "rank {}: {net:?}", f.rank);
                continue;
            }
            let updates: std::collections::HashMap<u64, i64> = f
                .stderr
                .lines()
                .filter_map(|l| l.strip_prefix("tree netupdate "))
                .map(|l| {
                    let mut w = l.split_whitespace().map(|x| x.parse::<i64>().unwrap());
                    (w.next().unwrap() as u64, w.next().unwrap())
                })
                .collect();
            let mut late = 0;
            for (id, s) in &steps {
                let kids: Vec<(&u64, &TreeEvent)> = net
                    .iter()
                    .copied()
                    .filter(|(_, e)| e.parent == **id as i64)
                    .collect();
                assert_eq!(kids.len(), 2, "rank {}: A and B under {s:?}", f.rank);
                let (a, b) = (kids[0], kids[1]);
                assert!(a.1.started_at < b.1.started_at);
                assert_eq!(a.1.states, [21], "{a:?}");
                assert!(b.1.states.is_empty(), "{b:?}");
                assert!(updates[a.0] > 0, "the size in A's update: {a:?}");
                for (_, e) in [a, b] {
                    assert_eq!(e.fields["id"], "0x7f0001", "{e:?}");
                    assert_eq!(e.fields["rank"], f.rank.to_string(), "{e:?}");
                    assert!(
                        e.started_at > s.started_at && e.stopped_at.is_some(),
                        "{e:?}"
                    );
                    late += (e.stopped_at > s.stopped_at) as usize;
                }
            }
            assert_eq!(net.len(), 2 * steps.len(), "rank {}", f.rank);
            assert!(late > 0, "rank {}: no event stopped after its step", f.rank);
            println!(
                "rank {}: {} steps, {} net events, {late} stopped after their step ended",
                f.rank,
                steps.len(),
                net.len()
            );
        }
    }
}

/// The device path's network proxy (oxccl::transport::proxy) reports
/// NCCL's proxy events from the launches the host announces, driven here
/// without a GPU: two proxies over the socket net on loopback, the test
/// playing both ranks' kernels on plain host areas (stores into the send
/// mirror, posts `tail`; reads the receive slots, posts `head`), rank 0's
/// proxy with the profiler_tree fixture. Three launches on two channels:
/// A and C profiled (each under its own Coll event), B announced with no
/// parent (the mask of its group asked for nothing). Expected: a ProxyOp
/// per (launch, channel, direction) of A and C, none for B, each under its
/// launch's Coll event with peer 1, its channel and step count; its steps
/// numbered from 0 with NCCL's states (send 8, 20, 9; receive 10, 11, 12),
/// each stopped between the op's start and stop; the op's one state
/// "in progress" (19); a socket event (NetPlugin) under every step and
/// nowhere else.
#[test]
fn device_proxy_reports_proxy_events_of_announced_launches() {
    let name = "device_proxy_reports_proxy_events_of_announced_launches";
    if as_child(name, |_| device_proxy::drive()) {
        return;
    }
    let done = spawn(
        name,
        1,
        &[
            ("NCCL_PROFILER_PLUGIN", &fixture("profiler_tree")),
            // Coll, ProxyOp, ProxyStep, NetPlugin.
            ("FIXTURE_PROFILER_MASK", "154"),
        ],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    let evs = tree_of(&done[0].stderr);
    let colls: Vec<u64> = evs
        .iter()
        .filter(|(_, e)| e.kind == "Coll")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(colls.len(), 2, "{evs:?}");
    let mut seen = Vec::new();
    for (id, op) in evs.iter().filter(|(_, e)| e.kind == "ProxyOp") {
        let launch = colls
            .iter()
            .position(|&c| c as i64 == op.parent)
            .unwrap_or_else(|| panic!("{op:?} is not under a Coll event"));
        let (chan, send): (usize, bool) = (
            op.fields["channel"].parse().unwrap(),
            op.fields["send"] == "1",
        );
        let n: usize = op.fields["steps"].parse().unwrap();
        assert_eq!(op.fields["peer"], "1", "{op:?}");
        assert_eq!(n as u64, device_proxy::steps(launch * 2, chan), "{op:?}");
        assert_eq!(op.states, [19], "{op:?}");
        seen.push((launch, chan, send));
        let steps: Vec<(&u64, &TreeEvent)> = evs
            .iter()
            .filter(|(_, s)| s.kind == "ProxyStep" && s.parent == *id as i64)
            .collect();
        let numbers: Vec<String> = steps.iter().map(|s| s.1.fields["step"].clone()).collect();
        let want: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        assert_eq!(numbers, want, "steps of {op:?}");
        for (sid, s) in steps {
            let order: &[i32] = if send { &[8, 20, 9] } else { &[10, 11, 12] };
            assert_eq!(s.states, order, "{s:?} of {op:?}");
            assert!(s.started_at > op.started_at && s.stopped_at < op.stopped_at);
            assert!(s.stopped_at.is_some(), "{s:?}");
            let net = evs
                .values()
                .filter(|e| e.kind == "NetPlugin" && e.parent == *sid as i64)
                .count();
            assert!(net >= 1, "no socket event under {s:?} of {op:?}");
        }
        assert!(op.stopped_at.is_some(), "{op:?}");
    }
    seen.sort();
    let mut want = Vec::new();
    for launch in 0..2 {
        for chan in 0..2 {
            if device_proxy::steps(launch * 2, chan) > 0 {
                want.extend([(launch, chan, false), (launch, chan, true)]);
            }
        }
    }
    assert_eq!(seen, want);
    for e in evs.values().filter(|e| e.kind == "NetPlugin") {
        assert_eq!(evs[&(e.parent as u64)].kind, "ProxyStep", "{e:?}");
    }
    let net = evs.values().filter(|e| e.kind == "NetPlugin").count();
    println!(
        "device proxy: {} proxy ops, {} steps, {net} socket events",
        seen.len(),
        evs.values().filter(|e| e.kind == "ProxyStep").count()
    );
}

mod device_proxy {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use oxccl::mem::reg::{RecvConn, SendConn};
    use oxccl::plugin::profiler::{Handle, ProfilerComm};
    use oxccl::transport::layout::{Layout, Proto};
    use oxccl::transport::proxy::{Areas, ConnSteps, Launch, Link, Proxy};
    use oxccl::transport::shm::area::Area;
    use oxccl::{DataType, Op, OpKind, RedOp};
    use oxccl_net_socket::testing::pair;
    use oxccl_net_socket::SocketNet;
    use oxccl_plugin::{RecvComm, SendComm};

    const CHANNELS: usize = 2;
    const LIMIT: Duration = Duration::from_secs(30);

    /// Steps launch `l` moves each way on channel `chan` (more than the 4
    /// slots, so that receives wait for free slots and announcements).
    pub fn steps(l: usize, chan: usize) -> u64 {
        [[7, 3], [2, 2], [5, 0]][l][chan]
    }

    /// One rank's kernel on host memory: per channel, stores and posts
    /// slices up to what its launches allow, and consumes what arrived.
    struct Kernel {
        rank: usize,
        mine: Arc<Area>,
        mirror: Arc<Area>,
        layout: Layout,
        sent: [u64; CHANNELS],
        recvd: [u64; CHANNELS],
    }

    impl Kernel {
        fn new(rank: usize, layout: Layout) -> Kernel {
            Kernel {
                rank,
                mine: Arc::new(Area::private(layout.bytes).unwrap()),
                mirror: Arc::new(Area::private(layout.bytes).unwrap()),
                layout,
                sent: [0; CHANNELS],
                recvd: [0; CHANNELS],
            }
        }

        fn poll(&mut self, upto: [u64; CHANNELS]) {
            let (layout, peer) = (&self.layout, 1 - self.rank);
            let l = layout.fifo(Proto::Simple);
            for (ch, &up) in upto.iter().enumerate() {
                let (out, inc) = (
                    layout.cell(self.rank, peer, ch),
                    layout.cell(peer, self.rank, ch),
                );
                let free = self.mine.load(l.head(inc)) + l.nslots as u64;
                if self.sent[ch] < up && self.sent[ch] < free {
                    let step = self.sent[ch];
                    let len = 100 + (step as usize * 37) % 900;
                    let at = self.mirror.at(l.slot(out, step), len);
                    // SAFETY: `at` is `len` bytes inside the mirror; the
                    // proxy reads the slot only between its post and `head`.
                    unsafe { std::ptr::write_bytes(at, (step as u8) ^ (ch as u8), len) };
                    self.mirror.store(l.size(out, step), len as u64);
                    self.sent[ch] += 1;
                    self.mirror.store(l.tail(out), self.sent[ch]);
                }
                if self.recvd[ch] < self.mine.load(l.tail(inc)) {
                    let step = self.recvd[ch];
                    let len = 100 + (step as usize * 37) % 900;
                    let at = self.mine.at(l.slot(inc, step), len);
                    // SAFETY: the proxy wrote this slot before it bumped
                    // `tail` and posts no receive into it until `head`
                    // passes it.
                    let got = unsafe { std::slice::from_raw_parts(at, len) };
                    assert!(got.iter().all(|&b| b == (step as u8) ^ (ch as u8)));
                    self.recvd[ch] += 1;
                    self.mirror.store(l.head(out), self.recvd[ch]);
                }
            }
        }
    }

    pub fn drive() {
        let lib = std::env::var("NCCL_PROFILER_PLUGIN").unwrap();
        let (p, _) = oxccl::plugin::profiler::load(Some(&lib)).unwrap();
        let prof =
            Arc::new(ProfilerComm::new(p.expect("the fixture loads"), 7, None, 2, 0, 1).unwrap());
        let mask = prof.mask();
        let net = SocketNet::new(Some("lo"), oxccl_netif::Family::V4, 0, 1).unwrap();
        let layout = Layout::new(2, CHANNELS, 4, 4096, 0);
        let mut kernels = [Kernel::new(0, layout), Kernel::new(1, layout)];
        let mut proxies = Vec::new();
        let mut sends: [Vec<Box<dyn SendComm>>; 2] = Default::default();
        let mut recvs: [Vec<Box<dyn RecvComm>>; 2] = Default::default();
        for _ in 0..CHANNELS {
            let (s01, r01) = pair(&net);
            let (s10, r10) = pair(&net);
            sends[0].push(s01);
            recvs[0].push(r10);
            sends[1].push(s10);
            recvs[1].push(r01);
        }
        for (rank, k) in kernels.iter().enumerate() {
            let (sends, recvs) = (
                std::mem::take(&mut sends[rank]),
                std::mem::take(&mut recvs[rank]),
            );
            let links = sends
                .into_iter()
                .zip(recvs)
                .enumerate()
                .map(|(chan, (s, r))| Link {
                    peer: 1 - rank,
                    chan,
                    send: SendConn::new(s),
                    recv: RecvConn::new(r),
                })
                .collect();
            let areas = Areas::on_host(k.mine.clone(), k.mirror.clone(), layout, rank, rank == 0);
            let proxy = Proxy::start(links, Vec::new(), areas).unwrap();
            let tracked = proxy.set_profiler((rank == 0).then(|| prof.clone()));
            assert_eq!(tracked, rank == 0);
            proxies.push(proxy);
        }
        let op = Op {
            kind: OpKind::AllReduce,
            input: std::ptr::null(),
            output: std::ptr::null_mut(),
            count: 1024,
            dtype: DataType::Float32,
            redop: RedOp::Sum,
            stream: 0,
            user_tag: 0,
            call: Default::default(),
        };
        let mut upto = [0u64; CHANNELS];
        let mut events = Vec::new();
        for l in 0..3 {
            // Launch 1 runs unprofiled: counted, with no parent.
            let parent = (l != 1).then(|| {
                let h = prof.coll(mask, &op, None, CHANNELS, Handle::NONE, Handle::NONE);
                events.push(h);
                h
            });
            let mut conns = Vec::new();
            for chan in 0..CHANNELS {
                for send in [true, false] {
                    conns.push(ConnSteps {
                        peer: 1,
                        chan,
                        send,
                        steps: steps(l, chan),
                        parent,
                        chunk_bytes: 1000,
                        proto: Proto::Simple,
                    });
                }
            }
            proxies[0].announce(Launch { mask, conns });
            proxies[0].kick();
            for (ch, u) in upto.iter_mut().enumerate() {
                *u += steps(l, ch);
            }
            let t = Instant::now();
            while kernels.iter().any(|k| k.recvd != upto || k.sent != upto) {
                for k in kernels.iter_mut() {
                    k.poll(upto);
                }
                assert!(t.elapsed() < LIMIT, "launch {l} stalled");
                assert!(proxies.iter().all(|p| p.failure().is_none()));
            }
        }
        // The last steps end when the proxy sees them consumed.
        std::thread::sleep(Duration::from_millis(100));
        for h in events {
            prof.stop(h);
        }
        drop(proxies);
    }
}

/// The tag the v7 tests give: above i64::MAX, so that a signed or
/// truncated copy anywhere on the way shows.
const TAG: u64 = 0xfedc_ba98_7654_3210;

/// The profiler v7 tests' workload on 2 ranks: an untagged all-reduce, an
/// all-reduce tagged [`TAG`], then a send and a receive tagged 42.
fn tagged_calls(r: oxccl_tests::Rank) {
    oxccl::log::init();
    let comm = r.comm(&[]);
    let mut buf = vec![0u8; 4096];
    comm.all_reduce(None, &mut buf, DataType::Float32, RedOp::Sum)
        .unwrap();
    let mut g = oxccl::Group::new();
    g.user_tag(TAG)
        .all_reduce(&comm, None, &mut buf, DataType::Float32, RedOp::Sum)
        .unwrap();
    g.run().unwrap();
    let peer = 1 - r.rank;
    let out = vec![1u8; 64];
    let mut inp = vec![0u8; 64];
    let mut g = oxccl::Group::new();
    g.user_tag(42);
    g.send(&comm, &out, DataType::Uint8, peer).unwrap();
    g.recv(&comm, &mut inp, DataType::Uint8, peer).unwrap();
    g.run().unwrap();
    comm.destroy().unwrap();
}

/// Profiler v7 (NCCL 2.31) is loaded before v6, and each call's tag
/// reaches its collective or p2p API event and its collective or p2p
/// event unchanged (0 for an untagged call), as NCCL's profiler.cc fills
/// `userTag`; the event tree is v5's.
#[test]
fn profiler_v7_gets_each_calls_user_tag() {
    let name = "profiler_v7_gets_each_calls_user_tag";
    if as_child(name, tagged_calls) {
        return;
    }
    let lib = fixture("profiler_v7");
    // GroupApi | CollApi | P2pApi | Group | Coll | P2p
    let mask = (256 | 512 | 1024 | 1 | 2 | 4).to_string();
    let done = spawn_with(
        name,
        &[
            ("NCCL_PROFILER_PLUGIN", &lib),
            ("FIXTURE_PROFILER_MASK", &mask),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT"),
        ],
    );
    for f in &done {
        let e = &f.stderr;
        assert!(
            e.contains(&format!(
                "loaded profiler plugin fixture-v7 from {lib} (ncclProfiler_v7)"
            )),
            "rank {}:\n{e}",
            f.rank
        );
        let evs = tree_of(e);
        let tags = |k: &str| -> Vec<u64> {
            evs.values()
                .filter(|e| e.kind == k)
                .map(|e| e.fields["tag"].parse().unwrap())
                .collect()
        };
        assert_eq!(tags("CollApi"), [0, TAG], "rank {}:\n{e}", f.rank);
        assert_eq!(tags("Coll"), [0, TAG], "rank {}:\n{e}", f.rank);
        assert_eq!(tags("P2pApi"), [42, 42], "rank {}:\n{e}", f.rank);
        assert_eq!(tags("P2p"), [42, 42], "rank {}:\n{e}", f.rank);
        for ev in evs.values().filter(|e| e.kind == "Coll" || e.kind == "P2p") {
            let api = &evs[&(ev.parent as u64)];
            assert_eq!(api.fields["tag"], ev.fields["tag"], "{ev:?} under {api:?}");
            // No kernel variant or symmetric kernel on host memory.
            if ev.kind == "Coll" {
                assert_eq!(
                    (ev.fields["variant"].as_str(), ev.fields["sym"].as_str()),
                    ("(null)", "0")
                );
            }
        }
        assert!(evs.values().all(|e| e.stopped_at.is_some()), "{e}");
    }
}

/// Our profiler plugin exports v1 to v7: loaded as it is, oxccl takes v7
/// and the trace shows each call's tag; through a library that offers only
/// its v6 vtable, oxccl takes v6 and the same program's trace has no tags
/// (v6 has no field for them) but the same events.
#[test]
fn our_profiler_loads_as_v7_with_tags_and_as_v6() {
    let name = "our_profiler_loads_as_v7_with_tags_and_as_v6";
    if as_child(name, tagged_calls) {
        return;
    }
    let ours = built_library("liboxccl_profiler.so")
        .expect("liboxccl_profiler.so next to the test binary (a dev-dependency builds it)");
    let ours = ours.to_string_lossy().into_owned();
    let shim = fixture("profiler_v6_shim");
    for (version, lib) in [(7, &ours), (6, &shim)] {
        let dir =
            std::env::temp_dir().join(format!("oxccl-prof-v{version}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_string_lossy().into_owned();
        let done = spawn_with(
            name,
            &[
                ("NCCL_PROFILER_PLUGIN", lib),
                ("FIXTURE_INNER_PROFILER", &ours),
                // Group, Coll, P2p, CollApi, P2pApi.
                ("NCCL_PROFILE_EVENT_MASK", "0x607"),
                ("OXCCL_PROFILER_DIR", &d),
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG_SUBSYS", "INIT"),
            ],
        );
        for f in &done {
            assert!(
                f.stderr.contains(&format!(
                    "loaded profiler plugin oxccl-profiler from {lib} (ncclProfiler_v{version})"
                )),
                "rank {}:\n{}",
                f.rank,
                f.stderr
            );
            let xs = trace_events(&dir, f.rank);
            let tags = |cat: &str, name: &str| -> Vec<Option<u64>> {
                xs.iter()
                    .filter(|e| e["cat"] == cat && e["name"] == name)
                    .map(|e| e["args"]["user_tag"].as_u64())
                    .collect()
            };
            let (t, s) = if version == 7 {
                (Some(TAG), Some(42))
            } else {
                (None, None)
            };
            for cat in ["api", "coll"] {
                let mut got = tags(cat, "AllReduce");
                got.sort();
                assert_eq!(got, [None, t], "v{version} {cat}, rank {}: {xs:?}", f.rank);
            }
            for (cat, n) in [
                ("api", "Send"),
                ("api", "Recv"),
                ("p2p", "Send"),
                ("p2p", "Recv"),
            ] {
                assert_eq!(
                    tags(cat, n),
                    [s],
                    "v{version} {cat} {n}, rank {}: {xs:?}",
                    f.rank
                );
            }
        }
        if std::env::var_os("OXCCL_KEEP_TRACES").is_none() {
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}
