//! Ranks sharing one GPU, which NCCL refuses: 2 and 4 ranks on GPU 0 in
//! one process (`-g N`: the last rank to call a collective runs it for
//! all; sends and receives on every rank's ring kernels, launches capped so
//! that every rank's blocks are resident at once) and 2 ranks in two processes
//! and 3 processes (without MPS rank 0 runs each collective on every
//! rank's buffers; `OXCCL_SHARED_GPU=kernels` makes every rank run its
//! kernels, time-sliced; rank 0 copies its own sends and receives,
//! `OXCCL_SHARED_P2P=pull` makes each receiver pull, `=server` makes rank
//! 0's thread copy the others', and the default runs under
//! `CUDA_DEVICE_MAX_CONNECTIONS=1` and with rank 0 not waiting for its
//! receivers too), every collective at sizes that
//! cross the channel cap, results checked against a host reference.
//! Skips, saying why, without a GPU.

use std::time::Instant;

mod common;

fn perf(args: &[&str], env: &[(&str, &str)]) {
    let t = Instant::now();
    let mut cmd = common::perf_command();
    cmd.args(args)
        .args(["--device", "cuda", "--op", "all", "-n", "2", "-w", "1"])
        // A hang (a copy queued behind a wait) ends as a failure.
        .args(["--time-limit", "120"])
        // GPU 0 only, however many the machine has.
        .env("CUDA_VISIBLE_DEVICES", "0")
        .env("NCCL_DEBUG", "INFO")
        .envs(env.iter().copied());
    let text = common::checked(&mut cmd, &format!("{args:?} {env:?}"));
    assert!(
        text.contains("shares its GPU with ranks"),
        "no INFO line about the shared GPU:\n{text}"
    );
    // One process, one-launch path (unless turned off): the line says so.
    let one_process = args.first() == Some(&"-g");
    let off = env.contains(&("OXCCL_SHARED_GPU", "kernels"));
    if one_process && !off {
        assert!(
            text.contains("in one process: collectives: the last of the"),
            "the INFO line does not name the in-process path:\n{text}"
        );
    }
    eprintln!("oxccl perf {args:?} {env:?}: #wrong 0 in {:?}", t.elapsed());
}

#[test]
fn ranks_share_one_gpu_in_one_and_two_processes() {
    let n = oxccl::cuda::device_count().unwrap_or(0);
    if n == 0 {
        eprintln!("skipped: no GPU (this test needs the CUDA driver and one GPU)");
        return;
    }
    for g in ["2", "4"] {
        perf(&["-g", g, "-b", "8", "-e", "16M", "-f", "64"], &[]);
    }
    for n in ["2", "3"] {
        perf(&["--ranks", n, "-b", "8", "-e", "16M", "-f", "64"], &[]);
    }
    // Send/recv pulled by each receiver's kernel; copied by rank 0's
    // thread; and the default (rank 0 copies its own messages) with one
    // hardware queue per context, where a copy queued in rank 0's context
    // behind rank 0's waits would hang.
    let sizes = ["-b", "8", "-e", "16M", "-f", "64"];
    for n in ["2", "4"] {
        let args = [&["--ranks", n][..], &sizes[..]].concat();
        perf(&args, &[("OXCCL_SHARED_P2P", "pull")]);
        perf(&args, &[("OXCCL_SHARED_P2P", "server")]);
        perf(&args, &[("CUDA_DEVICE_MAX_CONNECTIONS", "1")]);
        // Rank 0 not waiting for its receivers at all: its messages are
        // pulled unless the receiver asked first, the late path.
        perf(&args, &[("OXCCL_SHARED_PUSH_WAIT_US", "0")]);
    }
    let kernels = [("OXCCL_SHARED_GPU", "kernels")];
    perf(
        &["--ranks", "2", "-b", "8", "-e", "4M", "-f", "512"],
        &kernels,
    );
}

/// Four processes on two GPUs (rank i on GPU i % 2): all-reduce runs in
/// steps on split communicators (a reduce on each GPU's ranks, an
/// all-reduce between the two GPUs, a broadcast on each), broadcast too
/// (from roots 0 and 3), send/recv between ranks of one GPU through that GPU's communicator (also as
/// a job's first operations), the rest as before; every result checked, and the INFO line names the
/// path. Skips, saying so, with fewer than 2 GPUs.
#[test]
fn ranks_of_several_processes_share_each_of_two_gpus() {
    let n = oxccl::cuda::device_count().unwrap_or(0);
    if n < 2 {
        eprintln!("skipped: {n} GPU(s) (this test needs two)");
        return;
    }
    // Root 3 is the second rank of GPU 1: its broadcast starts on its GPU.
    for (ops, env, root) in [
        // Messages before any collective: the split is there from the start.
        ("sendrecv,all_to_all", "1", "0"),
        ("all", "1", "0"),
        ("broadcast", "1", "3"),
        ("all_reduce", "0", "0"),
    ] {
        let t = Instant::now();
        let mut cmd = common::perf_command();
        cmd.args([
            "--ranks", "4", "--device", "cuda", "--op", ops, "--root", root,
        ])
        .args(["-b", "8", "-e", "16M", "-f", "64", "-n", "2", "-w", "1"])
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .env("NCCL_DEBUG", "INFO")
        .env("OXCCL_HIER", env);
        let text = common::checked(&mut cmd, &format!("mixed layout, OXCCL_HIER={env}"));
        let stepped = text.contains("all_reduce runs as a reduce on each GPU's ranks");
        assert_eq!(stepped, env == "1", "OXCCL_HIER={env}:\n{text}");
        let routed =
            text.contains("send/recv between ranks of one GPU through its GPU's communicator");
        assert_eq!(routed, env == "1", "OXCCL_HIER={env}:\n{text}");
        eprintln!(
            "oxccl perf --ranks 4 on 2 GPUs, --op {ops}, OXCCL_HIER={env}: #wrong 0 in {:?}",
            t.elapsed()
        );
    }
}
