//! The host reduction of the direct path (`mem::reduce_all`): every
//! rank's chunk of 64 KiB (the direct path's `CHUNK`) combined into one,
//! as it runs (a pass over the whole result per input, the result staying
//! in L2), against taking one L1-sized block of the result at a time
//! through every input (each input read once), which was tried and is
//! slower on the CPUs measured (docs/performance.md, "Tried and not kept").
//! `cargo bench -p oxccl --bench reduce`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use oxccl::reduce::{Reducer, Stage};
use oxccl::{DataType, RedOp};

const CHUNK: usize = 64 << 10;

fn stage(pre_a: bool, last: bool) -> Stage {
    Stage {
        pre_a,
        pre_b: true,
        post: last,
    }
}

/// As `mem::reduce_all`.
fn passes(r: &Reducer, dst: &mut [u8], inputs: &[&[u8]]) {
    let [a, b, rest @ ..] = inputs else {
        return;
    };
    r.combine(dst, a, b, stage(true, rest.is_empty()));
    for (i, x) in rest.iter().enumerate() {
        r.combine_into(dst, x, stage(false, i + 1 == rest.len()));
    }
}

/// The alternative: `block` bytes of the result through every input.
fn blocks(r: &Reducer, dst: &mut [u8], inputs: &[&[u8]], block: usize) {
    let mut off = 0;
    while off < dst.len() {
        let end = (off + block).min(dst.len());
        let part: Vec<&[u8]> = inputs.iter().map(|x| &x[off..end]).collect();
        passes(r, &mut dst[off..end], &part);
        off = end;
    }
}

fn bench(c: &mut Criterion) {
    for n in [2usize, 4, 8] {
        let r = Reducer::new(DataType::Float32, RedOp::Sum, n);
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                (0..CHUNK / 4)
                    .flat_map(|i| ((i * 7 + k) as f32).to_ne_bytes())
                    .collect()
            })
            .collect();
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut dst = vec![0u8; CHUNK];
        let mut g = c.benchmark_group(format!("f32 sum of {n} x 64 KiB"));
        g.throughput(Throughput::Bytes(CHUNK as u64));
        g.bench_function("a pass per input", |b| {
            b.iter(|| passes(&r, black_box(&mut dst), black_box(&views)))
        });
        for block in [4096, 16384] {
            g.bench_function(
                format!("{} KiB blocks through every input", block >> 10),
                |b| b.iter(|| blocks(&r, black_box(&mut dst), black_box(&views), block)),
            );
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
