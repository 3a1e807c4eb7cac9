//! The profiler on the peer-kernel device path: our trace profiler
//! (liboxccl_profiler.so) loaded into two ranks, each a process on its own
//! GPU, sees a group event per group, an event per operation under it, and
//! with NCCL_PROFILE_EVENT_MASK's KernelCh bit one kernel-channel event per
//! channel the operation's kernel used, under the operation, with the
//! GPU's start and end times. With one GPU it runs one rank (its kernels
//! still run the schedule's local step), without sends and receives;
//! without a GPU it skips, saying so.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use oxccl::cuda::{DeviceBuffer, FillPattern};
use oxccl::OpKind;
use oxccl_tests::gpu::{self, GpuRank};
use oxccl_tests::tree::{tree_of, TreeEvent};
use oxccl_tests::{as_child, assert_all_ok, built_library, spawn, trace_events, Rank};
use serde_json::Value;

/// All-reduce element counts: from one channel to many.
const SIZES: [usize; 3] = [1024, 1 << 20, 16 << 20];
/// Send/recv and all-gather element count.
const P2P: usize = 1 << 20;

fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 5,
        modulus: 17,
        offset: -8,
    }
}

/// The ranks to run (one per GPU, at most 2), or `None`, saying why,
/// without a GPU or without NVRTC to build the kernels.
fn runnable() -> Option<usize> {
    let n = gpu::ranks()?;
    if let Err(e) = oxccl::cuda::nvrtc::version() {
        println!("skipped: {e}");
        return None;
    }
    Some(n)
}

/// One rank: all-reduces of every size (checked), an all-gather, and
/// (with a peer) a group of a send and a receive with the other rank.
fn rank_body(r: Rank) {
    ops_body(&r, GpuRank::join(&r));
}

/// As [`rank_body`], every rank on GPU 0.
fn shared_rank_body(r: Rank) {
    ops_body(&r, GpuRank::join_on(&r, 0));
}

fn ops_body(r: &Rank, g: GpuRank) {
    let big = *SIZES.iter().max().unwrap();
    let input = DeviceBuffer::alloc(&g.ctx, big * 4).unwrap();
    let output = DeviceBuffer::alloc(&g.ctx, big * 4 * r.nranks).unwrap();
    let wrong: usize = SIZES
        .iter()
        .map(|&n| g.checked_all_reduce(&input, &output, n, pattern))
        .sum();
    assert_eq!(wrong, 0, "rank {}: all-reduce results", r.rank);
    let ag = g.op(OpKind::AllGather, input.ptr(), output.ptr(), P2P);
    // SAFETY: device buffers of this rank's GPU, sized for the op, alive
    // until the stream is synchronised below.
    unsafe { g.comm.enqueue(ag) }.unwrap();
    if r.nranks > 1 {
        exchange(&g, 1 - r.rank, &input, &output, P2P);
    }
    g.stream.synchronize().unwrap();
    g.comm.destroy().unwrap();
}

/// `count` floats of `input` sent to `peer` and as many received from it
/// into `output`, in one group.
fn exchange(g: &GpuRank, peer: usize, input: &DeviceBuffer, output: &DeviceBuffer, count: usize) {
    oxccl::group_start();
    let send = g.op(OpKind::Send { peer }, input.ptr(), 0, count);
    let recv = g.op(OpKind::Recv { peer }, 0, output.ptr(), count);
    // SAFETY: device buffers of this rank's GPU, sized for the ops by the
    // caller, alive until it synchronises the stream; they do not overlap.
    unsafe {
        g.comm.enqueue(send).unwrap();
        g.comm.enqueue(recv).unwrap();
    }
    oxccl::group_end().unwrap();
}

#[test]
fn device_path_reports_kernel_channels_under_their_operations() {
    let name = "device_path_reports_kernel_channels_under_their_operations";
    if as_child(name, rank_body) {
        return;
    }
    let Some(nranks) = runnable() else {
        return;
    };
    // 0x47: group, coll, p2p and kernel channels; 7 lacks the last.
    for (mask, kernel) in [("0x47", true), ("7", false)] {
        traced_run(name, nranks, mask, kernel);
    }
}

/// Two ranks, each a process, sharing GPU 0 (the shared-GPU path, whose
/// leader would otherwise run every collective and copy every send and
/// receive itself): with kernel-channel events asked for, every
/// collective and every send and receive still reports one per channel,
/// with the GPU's times, as on separate GPUs.
#[test]
fn shared_gpu_reports_kernel_channels_for_every_operation() {
    let name = "shared_gpu_reports_kernel_channels_for_every_operation";
    if as_child(name, shared_rank_body) {
        return;
    }
    if runnable().is_none() {
        return;
    }
    traced_run(name, 2, "0x47", true);
}

/// Runs test `name`'s children as `nranks` ranks under our trace profiler
/// with `mask`, and checks each rank's trace (`kernel`: kernel-channel
/// events asked for).
fn traced_run(name: &str, nranks: usize, mask: &str, kernel: bool) {
    let lib = built_library("liboxccl_profiler.so")
        .expect("liboxccl_profiler.so next to the test binary (a dev-dependency builds it)");
    let lib = lib.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!(
        "oxccl-gpu-prof-{}-{name}-{mask}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_string_lossy().into_owned();
    let done = spawn(
        name,
        nranks,
        &[
            ("NCCL_PROFILER_PLUGIN", &lib),
            ("NCCL_PROFILE_EVENT_MASK", mask),
            ("OXCCL_PROFILER_DIR", &d),
            ("NCCL_NVLS_ENABLE", "0"),
        ],
        Duration::from_secs(120),
    );
    assert_all_ok(&done);
    for rank in 0..nranks {
        let xs = trace_events(&dir, rank);
        check_rank(rank, nranks, &xs, kernel);
        println!(
            "rank {rank}, mask {mask}: {} events, {} kernel-channel events",
            xs.len(),
            xs.iter().filter(|e| e["cat"] == "kernel").count()
        );
    }
    if std::env::var_os("OXCCL_KEEP_TRACES").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}

fn check_rank(rank: usize, nranks: usize, xs: &[Value], kernel: bool) {
    let by_id: HashMap<u64, &Value> = xs
        .iter()
        .map(|e| (e["args"]["id"].as_u64().unwrap(), e))
        .collect();
    let named = |n: &str| xs.iter().filter(|e| e["name"] == n).count();
    assert_eq!(named("AllReduce"), SIZES.len(), "rank {rank}: {xs:?}");
    assert_eq!(named("AllGather"), 1, "rank {rank}");
    let p2p = if nranks > 1 { 2 } else { 0 };
    assert_eq!(named("Send") + named("Recv"), p2p, "rank {rank}");
    let ops: Vec<&Value> = xs
        .iter()
        .filter(|e| e["cat"] == "coll" || e["cat"] == "p2p")
        .collect();
    // Since the v5 API events an operation's parent is its CollApi or
    // P2pApi event; where the plugin does not track those (this mask),
    // the SDK gives the group it ran in (`parentGroup`), as the host-path
    // test in plugins.rs asserts.
    for e in &ops {
        if let Some(p) = e["args"]["parent"].as_u64() {
            let g = by_id
                .get(&p)
                .unwrap_or_else(|| panic!("rank {rank}: {e}'s parent"));
            assert!(
                g["cat"] == "api" || g["cat"] == "group",
                "rank {rank}: {e} under {g}"
            );
        }
    }
    let kernels: Vec<&Value> = xs.iter().filter(|e| e["cat"] == "kernel").collect();
    if !kernel {
        assert!(kernels.is_empty(), "rank {rank}: {kernels:?}");
        return;
    }
    let mut channel_counts = BTreeSet::new();
    for e in &ops {
        let id = e["args"]["id"].as_u64().unwrap();
        let mine: Vec<&&Value> = kernels
            .iter()
            .filter(|k| k["args"]["parent"].as_u64() == Some(id))
            .collect();
        let nch = e["args"]["channels"].as_u64().expect("channels") as usize;
        let chans: BTreeSet<u64> = mine
            .iter()
            .map(|k| k["args"]["channels"].as_u64().unwrap())
            .collect();
        assert_eq!(mine.len(), nch, "rank {rank}: kernel channels of {e}");
        for k in &mine {
            // The GPU's globaltimer at the block's start and end, and the
            // event lasting that long (trace times are microseconds).
            let (t0, t1) = (
                k["args"]["gpu_start_ns"].as_u64().expect("a GPU start"),
                k["args"]["gpu_stop_ns"].as_u64().expect("a GPU stop"),
            );
            assert!(t0 > 0 && t1 >= t0, "rank {rank}: {k}");
            let dur = k["dur"].as_f64().unwrap();
            assert!(
                (dur - (t1 - t0) as f64 / 1e3).abs() < 0.01,
                "rank {rank}: {k}"
            );
        }
        assert_eq!(chans, (0..nch as u64).collect(), "rank {rank}: {e}");
        channel_counts.insert(nch);
    }
    // The sizes span one channel to many.
    assert!(channel_counts.len() >= 2, "{channel_counts:?}");
    assert_eq!(
        kernels.len(),
        ops.iter()
            .map(|e| e["args"]["channels"].as_u64().unwrap() as usize)
            .sum::<usize>(),
        "rank {rank}: every kernel-channel event has an operation"
    );
}

/// All-reduces of `NET_SIZES` (checked) and a send/recv group, 2 ranks on
/// GPUs `rank % GPUs` (both on GPU 0 with one).
fn net_rank_body(r: Rank) {
    let gpus = oxccl::cuda::device_count().unwrap();
    let g = GpuRank::join_on(&r, r.rank % gpus);
    let big = *NET_SIZES.iter().max().unwrap();
    let input = DeviceBuffer::alloc(&g.ctx, big * 4).unwrap();
    let output = DeviceBuffer::alloc(&g.ctx, big * 4 * r.nranks).unwrap();
    let wrong: usize = NET_SIZES
        .iter()
        .map(|&n| g.checked_all_reduce(&input, &output, n, pattern))
        .sum();
    assert_eq!(wrong, 0, "rank {}: all-reduce results", r.rank);
    exchange(&g, 1 - r.rank, &input, &output, NET_P2P);
    g.stream.synchronize().unwrap();
    g.comm.destroy().unwrap();
}

/// All-reduce element counts over the network: one slice, many.
const NET_SIZES: [usize; 2] = [1024, 1 << 20];
const NET_P2P: usize = 256 << 10;

/// The device path through the network proxy (NCCL_P2P_DISABLE=1 and
/// NCCL_SHM_DISABLE=1: every peer through the socket net, GPU slots
/// moved by the proxy thread), with the profiler_tree fixture asking for
/// Coll, P2p, ProxyOp, ProxyStep and NetPlugin events: per rank, a proxy
/// op under every collective and p2p event for each direction it moves
/// (peer the other rank), none elsewhere; its steps numbered from 0, as
/// many as it announced, with NCCL's net.cc states (send: GPU wait 8, peer
/// wait 20, send wait 9; receive: recv wait 10, flush wait 11, GPU wait
/// 12), each stopped inside the op; the op's one state "in progress" (19);
/// a socket event (NetPlugin, NCCL's socket descriptor) under every step
/// and only under steps. Two ranks on one GPU when there is only one.
#[test]
fn device_net_proxy_reports_proxy_ops_steps_and_net_events() {
    let name = "device_net_proxy_reports_proxy_ops_steps_and_net_events";
    if as_child(name, net_rank_body) {
        return;
    }
    if runnable().is_none() {
        return;
    }
    let lib = format!("{}/libprofiler_tree.so", env!("OXCCL_FIXTURES"));
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_PROFILER_PLUGIN", &lib),
            // Coll, P2p, ProxyOp, ProxyStep, NetPlugin.
            ("FIXTURE_PROFILER_MASK", "158"),
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_NVLS_ENABLE", "0"),
        ],
        Duration::from_secs(180),
    );
    assert_all_ok(&done);
    for f in &done {
        let rank = f.rank;
        let evs = tree_of(&f.stderr);
        let mut ops_under = HashMap::new();
        let (mut nsteps, mut nnet) = (0, 0);
        for (id, op) in evs.iter().filter(|(_, e)| e.kind == "ProxyOp") {
            let parent = &evs[&(op.parent as u64)];
            assert!(
                parent.kind == "Coll" || parent.kind == "P2p",
                "rank {rank}: {op:?} under {parent:?}"
            );
            let send = op.fields["send"] == "1";
            ops_under
                .entry(op.parent)
                .or_insert_with(BTreeSet::new)
                .insert(send);
            assert_eq!(op.fields["peer"], (1 - rank).to_string(), "{op:?}");
            assert_eq!(op.states, [19], "rank {rank}: {op:?}");
            assert!(op.stopped_at.is_some(), "rank {rank}: {op:?}");
            let steps: Vec<(&u64, &TreeEvent)> = evs
                .iter()
                .filter(|(_, s)| s.kind == "ProxyStep" && s.parent == *id as i64)
                .collect();
            let n: usize = op.fields["steps"].parse().unwrap();
            let numbers: Vec<String> = steps.iter().map(|s| s.1.fields["step"].clone()).collect();
            let want: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            assert_eq!(numbers, want, "rank {rank}: steps of {op:?}");
            for (sid, s) in steps {
                let order: &[i32] = if send { &[8, 20, 9] } else { &[10, 11, 12] };
                assert_eq!(s.states, order, "rank {rank}: {s:?} of {op:?}");
                assert!(s.stopped_at.is_some() && s.stopped_at < op.stopped_at);
                assert!(s.started_at > op.started_at, "{s:?} of {op:?}");
                let net: Vec<&TreeEvent> = evs
                    .values()
                    .filter(|e| e.kind == "NetPlugin" && e.parent == *sid as i64)
                    .collect();
                assert!(!net.is_empty(), "rank {rank}: no socket event under {s:?}");
                for e in &net {
                    assert_eq!(e.fields["id"], "0x20001", "{e:?}");
                    let want_op = if send { "0" } else { "1" };
                    assert_eq!(e.fields["op"], want_op, "{e:?} under {op:?}");
                    assert!(e.started_at > s.started_at && e.stopped_at < s.stopped_at);
                }
                nsteps += 1;
                nnet += net.len();
            }
        }
        for e in evs.values().filter(|e| e.kind == "NetPlugin") {
            assert_eq!(evs[&(e.parent as u64)].kind, "ProxyStep", "{e:?}");
        }
        // Every operation moved data both ways (a ring of two, a send and
        // a receive): all-reduces under both directions, Send under send,
        // Recv under receive.
        for (id, e) in evs
            .iter()
            .filter(|(_, e)| e.kind == "Coll" || e.kind == "P2p")
        {
            let dirs = ops_under.get(&(*id as i64)).cloned().unwrap_or_default();
            let want: BTreeSet<bool> = match e.fields.get("func").map(String::as_str) {
                Some("Send") => [true].into(),
                Some("Recv") => [false].into(),
                _ => [false, true].into(),
            };
            assert_eq!(dirs, want, "rank {rank}: proxy ops of {e:?}");
        }
        let colls = evs.values().filter(|e| e.kind == "Coll").count();
        let p2ps = evs.values().filter(|e| e.kind == "P2p").count();
        assert_eq!((colls, p2ps), (NET_SIZES.len(), 2), "rank {rank}");
        println!(
            "rank {rank}: {} proxy ops, {nsteps} steps, {nnet} socket events",
            ops_under.values().map(BTreeSet::len).sum::<usize>()
        );
    }
}
