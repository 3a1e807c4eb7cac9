//! Mismatched counts on the GPU path (issue 40, item 2c): two processes
//! share GPU 0 (any machine with one) and all-reduce device buffers, rank
//! 0 of 1024 floats, rank 1 of 2048. The host never waits for device
//! work, so the kernels used to wait on each other until NCCL_TIMEOUT and
//! then trap. Now every rank's error (ncclCommGetAsyncError's, polled as
//! PyTorch's watchdog polls it) must name the mismatch within WATCH, far
//! below NCCL_TIMEOUT, and the stream must come free (the kernels ended,
//! not trapped). On every rank's kernels (OXCCL_SHARED_GPU=kernels: the
//! host's watch of launched work asks the peers' call books) and on the
//! shared-GPU path (the leader sees every rank's call). Skips, saying so,
//! without a GPU.

use std::time::{Duration, Instant};

use oxccl::cuda::{Context, Device, DeviceBuffer, Event, Stream};
use oxccl::{Comm, CommConfig, OpKind};
use oxccl_tests::{as_child, spawn, Rank};

const NRANKS: usize = 2;
/// Far below NCCL_TIMEOUT: a mismatch found by the kernels' trap is a failure.
const WATCH: Duration = Duration::from_secs(10);
const TIMEOUT_S: &str = "60";

fn rank_body(r: Rank) {
    oxccl::log::init();
    let cfg = CommConfig {
        device: Some(0),
        ..CommConfig::default()
    };
    let comm = Comm::init_rank(r.nranks, r.id, r.rank, &cfg).expect("init_rank on GPU 0");
    let ctx = Context::primary(Device::get(0).unwrap()).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let count = if r.rank == 0 { 1024 } else { 2048 };
    let input = DeviceBuffer::alloc(&ctx, count * 4).unwrap();
    let output = DeviceBuffer::alloc(&ctx, count * 4).unwrap();
    let s = stream.handle();
    let op = oxccl::Op {
        kind: OpKind::AllReduce,
        input: input.ptr() as usize as *const u8,
        output: output.ptr() as usize as *mut u8,
        count,
        dtype: oxccl::DataType::Float32,
        redop: oxccl::RedOp::Sum,
        stream: s.raw(),
        user_tag: 0,
        call: Default::default(),
    };
    let t = Instant::now();
    // SAFETY: device buffers of this GPU of `count` floats, alive until the
    // stream passed the operation (waited for below).
    let named = match unsafe { comm.enqueue(op) } {
        Err(e) => e.to_string(),
        Ok(()) => loop {
            if let Err(e) = comm.async_error() {
                break e.to_string();
            }
            assert!(
                t.elapsed() < WATCH,
                "rank {}: no error within {WATCH:?}",
                r.rank
            );
            std::thread::sleep(Duration::from_millis(1));
        },
    };
    let took = t.elapsed();
    // The shared-GPU path's leader names both calls; another rank there
    // says that its call differs and that the leader's error names them.
    let names = named.contains("mismatched counts")
        || named.contains("1024") && named.contains("2048")
        || named.contains("not every rank called the same");
    assert!(
        names,
        "rank {}: the error does not name the mismatch: {named}",
        r.rank
    );
    // The kernels ended: the stream comes free.
    let done = Event::new(&ctx, false).unwrap();
    done.record(s).unwrap();
    let t = Instant::now();
    while !done.query().unwrap_or(true) {
        assert!(
            t.elapsed() < WATCH,
            "rank {}: the stream still waits {WATCH:?} after the error",
            r.rank
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "PASS rank {}: named in {:.1} ms: {named}",
        r.rank,
        took.as_secs_f64() * 1e3
    );
    comm.abort();
}

fn run_case(name: &str, env: &[(&str, &str)]) {
    if as_child(name, rank_body) {
        return;
    }
    if oxccl_tests::gpu::ranks().is_none() {
        return;
    }
    let mut vars = vec![("NCCL_TIMEOUT", TIMEOUT_S)];
    vars.extend_from_slice(env);
    let done = spawn(name, NRANKS, &vars, Duration::from_secs(120));
    oxccl_tests::assert_all_ok(&done);
    for f in &done {
        assert!(f.stdout.contains("PASS"), "rank {}:\n{}", f.rank, f.stdout);
        eprintln!("{}", f.stdout.trim_end());
    }
}

#[test]
fn gpu_mismatched_counts_every_ranks_kernels() {
    run_case(
        "gpu_mismatched_counts_every_ranks_kernels",
        &[("OXCCL_SHARED_GPU", "kernels"), ("OXCCL_DEVICE_WATCH", "1")],
    );
}

#[test]
fn gpu_mismatched_counts_shared_gpu() {
    run_case("gpu_mismatched_counts_shared_gpu", &[]);
}
