//! What the GPU tests of this crate share: how many ranks the machine
//! allows (or why the test is skipped), a rank joined on its own GPU, and
//! an all-reduce checked against the host's sum.

use oxccl::cuda::{Context, Device, DeviceBuffer, FillPattern, KernelSet, Stream};
use oxccl::{Comm, CommConfig, DataType, Op, OpKind, RedOp};

use crate::Rank;

/// Ranks for a test of up to two, one GPU each: `None` (having printed why
/// the test is skipped, and it passes: CI has no GPU) without a GPU.
pub fn ranks() -> Option<usize> {
    let n = match oxccl::cuda::device_count() {
        Err(e) => {
            println!("skipped: {e}");
            return None;
        }
        Ok(0) => {
            println!("skipped: no GPU found");
            return None;
        }
        Ok(n) => n.min(2),
    };
    println!("{n} rank(s), one GPU each");
    Some(n)
}

/// A rank of a test's communicator on GPU `rank`, with its GPU's kernels
/// (to fill inputs) and a stream of its own.
pub struct GpuRank {
    pub rank: usize,
    pub nranks: usize,
    pub comm: Comm,
    pub ctx: std::sync::Arc<Context>,
    pub kernels: KernelSet,
    pub stream: Stream,
}

impl GpuRank {
    pub fn join(r: &Rank) -> GpuRank {
        GpuRank::join_on(r, r.rank)
    }

    /// As [`GpuRank::join`], on GPU `device` (ranks may share one).
    pub fn join_on(r: &Rank, device: usize) -> GpuRank {
        let cfg = CommConfig {
            device: Some(device),
            ..CommConfig::default()
        };
        let comm = Comm::init_rank(r.nranks, r.id, r.rank, &cfg).expect("init_rank on a GPU");
        let ctx = Context::primary(Device::get(device).unwrap()).unwrap();
        GpuRank {
            rank: r.rank,
            nranks: r.nranks,
            comm,
            kernels: KernelSet::new(&ctx).unwrap(),
            stream: Stream::new(&ctx).unwrap(),
            ctx,
        }
    }

    /// An operation of `count` floats on this rank's stream.
    pub fn op(&self, kind: OpKind, input: u64, output: u64, count: usize) -> Op {
        Op {
            kind,
            input: input as usize as *const u8,
            output: output as usize as *mut u8,
            count,
            dtype: DataType::Float32,
            redop: RedOp::Sum,
            stream: self.stream.handle().raw(),
            user_tag: 0,
            call: Default::default(),
        }
    }

    /// Sums `count` floats of every rank's input pattern into `output`
    /// (both device buffers of this GPU) and returns how many elements
    /// differ from the host's sum.
    pub fn checked_all_reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        count: usize,
        pattern: fn(usize) -> FillPattern,
    ) -> usize {
        let s = self.stream.handle();
        self.kernels
            .fill(input.ptr(), count, DataType::Float32, pattern(self.rank), s)
            .unwrap();
        let op = self.op(OpKind::AllReduce, input.ptr(), output.ptr(), count);
        // SAFETY: device buffers of this rank's GPU, sized for the op by
        // the caller, alive until the stream is synchronised below.
        unsafe { self.comm.enqueue(op) }.unwrap();
        self.stream.synchronize().unwrap();
        let mut got = vec![0u8; count * 4];
        output.read(0, &mut got).unwrap();
        (0..count)
            .filter(|&i| {
                let want: f32 = (0..self.nranks).map(|p| pattern(p).value(i) as f32).sum();
                f32::from_ne_bytes(got[i * 4..i * 4 + 4].try_into().unwrap()) != want
            })
            .count()
    }
}

/// Every collective (float32 sum, out of place and in place), rooted at
/// `root`, at each of `sizes` bytes, on device buffers of GPU `gpu`,
/// checked against the host's reference: the cases with wrong elements or
/// errors, each named (empty when all are right).
pub fn every_collective_on_gpu(
    comm: &Comm,
    gpu: usize,
    root: usize,
    sizes: &[usize],
) -> Vec<String> {
    let mut bad = Vec::new();
    for coll in crate::check::Coll::ALL {
        for &size in sizes {
            for inplace in [false, true] {
                let case = oxccl_cli::perf::Case {
                    coll,
                    dtype: DataType::Float32,
                    op: RedOp::Sum,
                    root,
                    size,
                    inplace,
                };
                match oxccl_cli::check_once_on_device(&case, comm, gpu) {
                    Ok(0) => {}
                    Ok(w) => bad.push(format!("{case:?}: {w} wrong")),
                    Err(e) => bad.push(format!("{case:?}: {e}")),
                }
            }
        }
    }
    bad
}
