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

/// One rank: all-reduces of every size (checked), an all-gather, and
/// (with a peer) a group of a send and a receive with the other rank.
fn rank_body(r: Rank) {
    let g = GpuRank::join(&r);
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
        let peer = 1 - r.rank;
        oxccl::group_start();
        let send = g.op(OpKind::Send { peer }, input.ptr(), 0, P2P);
        let recv = g.op(OpKind::Recv { peer }, 0, output.ptr(), P2P);
        // SAFETY: as above; the two buffers do not overlap.
        unsafe {
            g.comm.enqueue(send).unwrap();
            g.comm.enqueue(recv).unwrap();
        }
        oxccl::group_end().unwrap();
    }
    g.stream.synchronize().unwrap();
    g.comm.destroy().unwrap();
}

#[test]
fn device_path_reports_kernel_channels_under_their_operations() {
    let name = "device_path_reports_kernel_channels_under_their_operations";
    if as_child(name, rank_body) {
        return;
    }
    let Some(nranks) = gpu::ranks() else {
        return;
    };
    if let Err(e) = oxccl::cuda::nvrtc::version() {
        return println!("skipped: {e}");
    }
    let lib = built_library("liboxccl_profiler.so")
        .expect("liboxccl_profiler.so next to the test binary (a dev-dependency builds it)");
    let lib = lib.to_string_lossy().into_owned();
    // 0x47: group, coll, p2p and kernel channels; 7 lacks the last.
    for (mask, kernel) in [("0x47", true), ("7", false)] {
        let dir =
            std::env::temp_dir().join(format!("oxccl-gpu-prof-{}-{mask}", std::process::id()));
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
