//! Collectives are stream-ordered: a kernel writes the input, the
//! collective runs, a kernel reads the output, with no host synchronisation
//! in between; and a collective on another stream still runs after the
//! previous one.

mod gpu_common;

use std::time::Duration;

use gpu_common::{two_ranks, with_ranks, NRANKS};
use oxccl::cuda::{DeviceBuffer, FillPattern, Stream};
use oxccl::exec::device::DeviceConfig;
use oxccl::{DataType, RedOp};

const COUNT: usize = 32 << 20;

fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 1,
        modulus: 13,
        offset: -6,
    }
}

#[test]
fn kernels_before_and_after_a_collective_see_its_order() {
    let Some((_gpus, devices)) = two_ranks() else {
        return;
    };
    // Two ranks of one process on one GPU share its hardware queues: the
    // late rank's fill can queue behind the first rank's waiting
    // collective and the copy after it, and neither ever runs (on one
    // H200 this waited out the test's limit). NCCL refuses that setup.
    if devices[0] == devices[1] {
        println!("skipped: the late rank needs a GPU of its own (two GPUs)");
        return;
    }
    let dtype = DataType::Float32;
    let bytes = COUNT * 4;
    let wrong = with_ranks(DeviceConfig::from_env().unwrap(), |r, barrier| {
        let ctx = r.comm.context().clone();
        let input = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        let output = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        let check = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        let gathered = DeviceBuffer::alloc(&ctx, bytes * NRANKS).unwrap();
        let check2 = DeviceBuffer::alloc(&ctx, bytes * NRANKS).unwrap();
        for b in [&input, &output, &check, &gathered, &check2] {
            b.fill_bytes(0xff).unwrap();
        }
        // Compile the kernels before timing matters.
        r.comm.kernels().prepare(dtype).unwrap();
        let other = Stream::new(&ctx).unwrap();
        barrier.wait();
        // One rank starts late: the other's collective waits on the GPU.
        if r.rank == 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let s = r.stream.handle();
        let k = r.comm.kernels();
        k.fill(input.ptr(), COUNT, dtype, pattern(r.rank), s)
            .unwrap();
        r.comm
            .all_reduce(input.ptr(), output.ptr(), COUNT, dtype, RedOp::Sum, s)
            .unwrap();
        let k = r.comm.kernels();
        k.copy(check.ptr(), output.ptr(), bytes, usize::MAX, s)
            .unwrap();
        // The next collective on another stream must still follow the first.
        let o = other.handle();
        r.comm
            .all_gather(output.ptr(), gathered.ptr(), COUNT, dtype, o)
            .unwrap();
        r.comm
            .kernels()
            .copy(check2.ptr(), gathered.ptr(), bytes * NRANKS, usize::MAX, o)
            .unwrap();
        r.stream.synchronize().unwrap();
        other.synchronize().unwrap();

        let mut got = vec![0u8; bytes];
        check.read(0, &mut got).unwrap();
        let mut got2 = vec![0u8; bytes * NRANKS];
        check2.read(0, &mut got2).unwrap();
        let mut wrong = 0;
        for i in 0..COUNT {
            let want: f32 = (0..NRANKS).map(|p| pattern(p).value(i) as f32).sum();
            let a = f32::from_ne_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
            if a != want {
                wrong += 1;
            }
            for p in 0..NRANKS {
                let j = p * COUNT + i;
                let b = f32::from_ne_bytes(got2[j * 4..j * 4 + 4].try_into().unwrap());
                if b != want {
                    wrong += 1;
                }
            }
        }
        println!(
            "rank {}: stream order: {wrong} wrong of {}",
            r.rank,
            COUNT * (1 + NRANKS)
        );
        wrong
    });
    assert_eq!(wrong.iter().sum::<usize>(), 0);
}

#[test]
fn local_reduce_and_copy_kernels() {
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    // One GPU is enough, but the helper sets up the communicator too.
    let wrong = with_ranks(DeviceConfig::from_env().unwrap(), |r, _| {
        if r.rank != 0 {
            return 0;
        }
        let ctx = r.comm.context().clone();
        let n = 1_000_003;
        let mut wrong = 0;
        for dtype in [
            DataType::Int8,
            DataType::Uint64,
            DataType::Float64,
            DataType::Float8e5m2,
        ] {
            let es = dtype.size();
            let a = DeviceBuffer::alloc(&ctx, n * es).unwrap();
            let b = DeviceBuffer::alloc(&ctx, n * es).unwrap();
            let d = DeviceBuffer::alloc(&ctx, n * es).unwrap();
            let ha = gpu_common::inputs(dtype, 7, n);
            let hb = gpu_common::inputs(dtype, 8, n);
            a.write(0, &ha).unwrap();
            b.write(0, &hb).unwrap();
            let s = r.stream.handle();
            let k = r.comm.kernels();
            // The second output is an input too, as for a peer in place.
            let (d2, ins) = ([d.ptr(), b.ptr()], [a.ptr(), b.ptr()]);
            k.reduce(&d2, &ins, n, dtype, RedOp::Min, 2, 0, usize::MAX, s)
                .unwrap();
            r.stream.synchronize().unwrap();
            let mut out = vec![0u8; n * es];
            let mut out2 = vec![0u8; n * es];
            d.read(0, &mut out).unwrap();
            b.read(0, &mut out2).unwrap();
            let red = oxccl::reduce::Reducer::new(dtype, RedOp::Min, 2);
            let mut want = vec![0u8; n * es];
            red.combine(&mut want, &ha, &hb, oxccl::reduce::Stage::default());
            let w = [&out, &out2]
                .iter()
                .map(|o| {
                    o.chunks(es)
                        .zip(want.chunks(es))
                        .filter(|(x, y)| x != y)
                        .count()
                })
                .sum::<usize>();
            let k = r.comm.kernels();
            k.copy(d.ptr() + 1, a.ptr() + 3, n * es - 3, usize::MAX, s)
                .unwrap();
            r.stream.synchronize().unwrap();
            d.read(0, &mut out).unwrap();
            let wc = (0..n * es - 3).filter(|&i| out[i + 1] != ha[i + 3]).count();
            println!(
                "local {}: min into two outputs {w} wrong, unaligned copy {wc} wrong",
                dtype.name()
            );
            wrong += w + wc;
        }
        wrong
    });
    assert_eq!(wrong.iter().sum::<usize>(), 0);
}
