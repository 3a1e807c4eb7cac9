//! The tuner plugin and NCCL_ALGO on the peer-kernel device path: our
//! TOML tuner (liboxccl_tuner.so) with a rule "all_reduce -> ring/simple on
//! 4 channels" changes what the kernels run, seen in the decision logged
//! at INFO and in the profiler's events (the collective's algorithm and
//! channels, and one kernel-channel event per channel actually launched),
//! with the results still right. Two ranks on two GPUs where there are
//! two (the device's own choice there is recursive doubling), else one
//! rank; skips, saying so, without a GPU.

use std::time::Duration;

use oxccl::cuda::{DeviceBuffer, FillPattern};
use oxccl_tests::gpu::{self, GpuRank};
use oxccl_tests::{as_child, assert_all_ok, built_library, spawn, trace_events, Rank};

/// One channel by default (4 KiB), and many (4 MiB).
const SIZES: [usize; 2] = [1024, 1 << 20];

fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 3,
        modulus: 11,
        offset: -5,
    }
}

fn rank_body(r: Rank) {
    // The tuner's decisions are INFO lines on stderr.
    oxccl::log::init();
    let g = GpuRank::join(&r);
    let big = *SIZES.iter().max().unwrap();
    let input = DeviceBuffer::alloc(&g.ctx, big * 4).unwrap();
    let output = DeviceBuffer::alloc(&g.ctx, big * 4).unwrap();
    let wrong: usize = SIZES
        .iter()
        .map(|&n| g.checked_all_reduce(&input, &output, n, pattern))
        .sum();
    assert_eq!(wrong, 0, "rank {}: all-reduce results", r.rank);
    g.comm.destroy().unwrap();
}

/// (algorithm, channels, kernel-channel events under it) of each all-reduce
/// of one rank's trace.
fn runs(dir: &std::path::Path, rank: usize) -> Vec<(String, u64, usize)> {
    let xs = trace_events(dir, rank);
    xs.iter()
        .filter(|e| e["name"] == "AllReduce")
        .map(|e| {
            let id = e["args"]["id"].as_u64();
            let kernels = xs
                .iter()
                .filter(|k| k["cat"] == "kernel" && k["args"]["parent"].as_u64() == id)
                .count();
            (
                e["args"]["algo"].as_str().unwrap().to_string(),
                e["args"]["channels"].as_u64().unwrap(),
                kernels,
            )
        })
        .collect()
}

#[test]
fn tuner_and_nccl_algo_choose_what_the_device_runs() {
    let name = "tuner_and_nccl_algo_choose_what_the_device_runs";
    if as_child(name, rank_body) {
        return;
    }
    let Some(nranks) = gpu::ranks() else {
        return;
    };
    let lib = |n: &str| {
        built_library(n)
            .unwrap_or_else(|| panic!("{n} next to the test binary (a dev-dependency builds it)"))
            .to_string_lossy()
            .into_owned()
    };
    let (tuner, profiler) = (lib("liboxccl_tuner.so"), lib("liboxccl_profiler.so"));
    let dir = std::env::temp_dir().join(format!("oxccl-gpu-tuner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\ncollective = \"all_reduce\"\nalgorithm = \"ring\"\nprotocol = \"simple\"\nchannels = 4\n",
    )
    .unwrap();
    let (rules, d) = (rules.to_string_lossy(), dir.to_string_lossy());
    let common = [
        ("NCCL_PROFILER_PLUGIN", profiler.as_str()),
        ("NCCL_PROFILE_EVENT_MASK", "0x47"),
        ("OXCCL_PROFILER_DIR", &d),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "TUNING"),
        ("NCCL_NVLS_ENABLE", "0"),
    ];
    // The device's own choice per size (floats), from the table it costs.
    let model = |count: usize| {
        let bytes = count * 4;
        use oxccl::algo::{cost, Coll};
        // One node of GPUs with peer access: NVLink (or PCIe) P2P.
        let fabric = cost::LinkModel::NVLINK.into();
        let t = cost::device_table(Coll::AllReduce, bytes, nranks, fabric, None);
        cost::pick(&t, Coll::AllReduce).unwrap().0.name()
    };

    // The tuner's rule: ring on 4 channels at every size.
    let mut env = common.to_vec();
    env.extend([
        ("NCCL_TUNER_PLUGIN", tuner.as_str()),
        ("OXCCL_TUNER_CONFIG", &*rules),
    ]);
    let done = spawn(name, nranks, &env, Duration::from_secs(120));
    assert_all_ok(&done);
    for f in &done {
        let decisions: Vec<&str> = f
            .stderr
            .lines()
            .filter(|l| l.contains("tuner oxccl-tuner: all_reduce of"))
            .collect();
        assert_eq!(
            decisions.len(),
            SIZES.len(),
            "rank {}:\n{}",
            f.rank,
            f.stderr
        );
        for (d, count) in decisions.iter().zip(SIZES) {
            assert!(
                d.contains(&format!(" of {} B on ", count * 4))
                    && d.contains("-> Ring (NCCL row 1")
                    && d.contains("4 channel(s)")
                    && d.contains(&format!("the model alone chose {}", model(count))),
                "{d}"
            );
        }
    }
    for rank in 0..nranks {
        let got = runs(&dir, rank);
        println!("rank {rank} with the tuner: {got:?}");
        assert_eq!(got, vec![("Ring".to_string(), 4, 4); SIZES.len()]);
    }
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();

    // No tuner: the device's own choice; NCCL_ALGO=Ring forces the ring.
    for algo in [None, Some("Ring")] {
        let mut env = common.to_vec();
        if let Some(a) = algo {
            env.push(("NCCL_ALGO", a));
        }
        let done = spawn(name, nranks, &env, Duration::from_secs(120));
        assert_all_ok(&done);
        for rank in 0..nranks {
            let got = runs(&dir, rank);
            println!("rank {rank}, NCCL_ALGO={algo:?}: {got:?}");
            assert_eq!(got.len(), SIZES.len());
            for ((a, nch, kernels), count) in got.into_iter().zip(SIZES) {
                assert_eq!(a, algo.unwrap_or(model(count)), "{count} floats");
                assert_eq!(nch as usize, kernels, "channels launched");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}
