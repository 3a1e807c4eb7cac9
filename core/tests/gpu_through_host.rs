//! GPU communicators whose GPUs may not map each other (NCCL_P2P_DISABLE=1,
//! as ranks on different nodes): the kernels move device buffers through
//! step slots in host memory (shared memory, or the net plugin's proxy),
//! still ordered on the caller's stream and without the enqueuing thread
//! waiting. Both ranks are issued from one
//! thread, so an enqueue that waited for its peer would never return.

mod gpu_common;

use gpu_common::{two_ranks, NRANKS};
use oxccl::cuda::{Context, Device, DeviceBuffer, FillPattern, KernelSet, Stream};
use oxccl::{Comm, CommConfig, DataType, InitState, Op, OpKind, RedOp};

const COUNT: usize = (4 << 20) + 3;

fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 11,
        modulus: 13,
        offset: -6,
    }
}

struct Rank {
    comm: Comm,
    kernels: KernelSet,
    stream: Stream,
    other: Stream,
    input: DeviceBuffer,
    output: DeviceBuffer,
    gathered: DeviceBuffer,
    check: DeviceBuffer,
    check2: DeviceBuffer,
}

fn op(kind: OpKind, input: u64, output: u64, count: usize, stream: &Stream) -> Op {
    Op {
        kind,
        input: input as usize as *const u8,
        output: output as usize as *mut u8,
        count,
        dtype: DataType::Float32,
        redop: RedOp::Sum,
        stream: stream.handle().raw(),
        user_tag: 0,
        call: Default::default(),
    }
}

#[test]
fn staged_collectives_keep_stream_order_without_blocking() {
    let Some((_gpus, devices)) = two_ranks() else {
        return;
    };
    let cfg = CommConfig::default()
        .with("P2P_DISABLE", "1")
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "30");
    let comms = Comm::init_all_devices(&devices, &cfg).expect("communicators");
    let bytes = COUNT * 4;
    let ranks: Vec<Rank> = comms
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            let ctx = Context::primary(Device::get(devices[r]).unwrap()).unwrap();
            let kernels = KernelSet::new(&ctx).unwrap();
            // Load the test's kernels now: loading a module may wait for the
            // context's queued work, which here waits for the other rank,
            // which this thread has not issued yet (NCCL's caveat about
            // lazy loading with several GPUs driven by one thread).
            let warm = DeviceBuffer::alloc(&ctx, 64).unwrap();
            let s0 = oxccl::cuda::RawStream::DEFAULT;
            kernels
                .fill(warm.ptr(), 8, DataType::Float32, pattern(0), s0)
                .unwrap();
            kernels
                .copy(warm.ptr() + 32, warm.ptr(), 32, usize::MAX, s0)
                .unwrap();
            ctx.synchronize().unwrap();
            let alloc = |n| {
                let b = DeviceBuffer::alloc(&ctx, n).unwrap();
                b.fill_bytes(0xff).unwrap();
                b
            };
            Rank {
                comm,
                stream: Stream::new(&ctx).unwrap(),
                other: Stream::new(&ctx).unwrap(),
                input: alloc(bytes),
                output: alloc(bytes),
                gathered: alloc(bytes * NRANKS),
                check: alloc(bytes),
                check2: alloc(bytes * NRANKS),
                kernels,
            }
        })
        .collect();
    // One thread issues both ranks, each call outside a group: rank 0's
    // calls must return before rank 1 has issued anything.
    for (r, d) in ranks.iter().enumerate() {
        let s = d.stream.handle();
        d.kernels
            .fill(d.input.ptr(), COUNT, DataType::Float32, pattern(r), s)
            .unwrap();
        let ar = op(
            OpKind::AllReduce,
            d.input.ptr(),
            d.output.ptr(),
            COUNT,
            &d.stream,
        );
        // SAFETY: device buffers of this rank's GPU, sized for the op,
        // alive until the streams are synchronised below.
        unsafe { d.comm.enqueue(ar) }.unwrap();
        d.kernels
            .copy(d.check.ptr(), d.output.ptr(), bytes, usize::MAX, s)
            .unwrap();
        // On another stream: must still follow the all-reduce.
        let ag = op(
            OpKind::AllGather,
            d.output.ptr(),
            d.gathered.ptr(),
            COUNT,
            &d.other,
        );
        // SAFETY: as above.
        unsafe { d.comm.enqueue(ag) }.unwrap();
        d.kernels
            .copy(
                d.check2.ptr(),
                d.gathered.ptr(),
                bytes * NRANKS,
                usize::MAX,
                d.other.handle(),
            )
            .unwrap();
    }
    let mut wrong = 0;
    for d in &ranks {
        d.stream.synchronize().unwrap();
        d.other.synchronize().unwrap();
        assert!(matches!(d.comm.async_error(), Ok(InitState::Ready)));
        let mut got = vec![0u8; bytes];
        d.check.read(0, &mut got).unwrap();
        let mut got2 = vec![0u8; bytes * NRANKS];
        d.check2.read(0, &mut got2).unwrap();
        let f = |b: &[u8], i: usize| f32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        for i in 0..COUNT {
            let want: f32 = (0..NRANKS).map(|p| pattern(p).value(i) as f32).sum();
            wrong += usize::from(f(&got, i) != want);
            for p in 0..NRANKS {
                wrong += usize::from(f(&got2, p * COUNT + i) != want);
            }
        }
    }
    println!(
        "staged (NCCL_P2P_DISABLE=1): all_reduce then all_gather on another stream, {wrong} wrong of {}",
        NRANKS * COUNT * (1 + NRANKS)
    );
    assert_eq!(wrong, 0);
    for d in ranks {
        d.comm.destroy().unwrap();
    }
}
