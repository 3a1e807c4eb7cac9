//! Ranks sharing one GPU, which NCCL refuses: 2 and 4 ranks on GPU 0 in
//! one process (`-g N`: the last rank to call a collective runs it for
//! all; sends and receives on every rank's ring kernels, launches capped so
//! that every rank's blocks are resident at once) and 2 ranks in two processes
//! and 3 processes (without MPS rank 0 runs each collective on every
//! rank's buffers; `OXCCL_SHARED_GPU=kernels` makes every rank run its
//! kernels, time-sliced; `OXCCL_SHARED_P2P=server` sends and receives
//! through rank 0's copy thread), every collective at sizes that
//! cross the channel cap, results checked against a host reference.
//! Skips, saying why, without a GPU.

use std::time::Instant;

mod common;

fn perf(args: &[&str], env: &[(&str, &str)]) {
    let t = Instant::now();
    let mut cmd = common::perf_command();
    cmd.args(args)
        .args(["--device", "cuda", "--op", "all", "-n", "2", "-w", "1"])
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
    // Send/recv through rank 0's copy thread.
    let server = [("OXCCL_SHARED_P2P", "server")];
    for n in ["2", "4"] {
        perf(&["--ranks", n, "-b", "8", "-e", "16M", "-f", "64"], &server);
    }
    let kernels = [("OXCCL_SHARED_GPU", "kernels")];
    perf(
        &["--ranks", "2", "-b", "8", "-e", "4M", "-f", "512"],
        &kernels,
    );
}
