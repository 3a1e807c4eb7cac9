//! `oxccl perf --device cuda` as the GPU acceptance run: every collective, a
//! sample of datatypes and ops, in and out of place, counts 0, 1, odd and
//! large, two ranks as two processes and as one process with `-g 2`; output
//! buffers poisoned before each checked run, results checked against a
//! float64 host reference; then again with NCCL_P2P_DISABLE=1 (device
//! kernels through host step slots: shared memory, then the net plugin). Skips, saying why, where fewer than two GPUs are
//! found.

mod common;

fn gpus() -> usize {
    oxccl::cuda::device_count().unwrap_or(0)
}

fn perf(mode: &[&str], sizes: &[&str], env: &[(&str, &str)]) {
    let mut cmd = common::perf_command();
    cmd.args(mode)
        .args(["--op", "all", "-d", "float,half,bfloat16,int32,f8e4m3"])
        .args(["-o", "sum,max,avg,premulsum", "-n", "2", "-w", "1"])
        .args(sizes)
        .envs(env.iter().copied());
    let text = common::checked(&mut cmd, &format!("{mode:?} {sizes:?} {env:?}"));
    let rows = text.lines().filter(|l| !l.starts_with('#')).count();
    eprintln!("oxccl perf {mode:?} {sizes:?} {env:?}: {rows} rows, #wrong 0");
}

#[test]
fn every_collective_on_two_gpus_in_one_and_two_processes() {
    let n = gpus();
    if n < 2 {
        eprintln!("skipped: {n} GPU(s) found, this test needs 2 (CUDA driver and GPUs)");
        return;
    }
    // Bytes: 0; 4 (count 1 of float, 2 of half); 12 (odd counts); 12 MiB
    // + 12 B (an odd count of floats, many chunks); 64 MiB.
    let sizes: [&[&str]; 5] = [
        &["-b", "0", "-e", "0"],
        &["-b", "4", "-e", "4"],
        &["-b", "12", "-e", "12"],
        &["-b", "12582924", "-e", "12582924"],
        &["-b", "64M", "-e", "64M"],
    ];
    let modes = [&["-g", "2"][..], &["--ranks", "2", "--device", "cuda"][..]];
    for mode in modes {
        for s in sizes {
            perf(mode, s, &[]);
        }
    }
    // Through host step slots: shared memory, then the socket network as
    // between nodes; the network is the slow part, so up to 12 MiB.
    for extra in [&[][..], &[("NCCL_SHM_DISABLE", "1")][..]] {
        for mode in modes {
            for s in &sizes[..4] {
                let mut env = vec![("NCCL_P2P_DISABLE", "1")];
                env.extend_from_slice(extra);
                perf(mode, s, &env);
            }
        }
    }
}
