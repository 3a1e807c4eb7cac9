//! Collectives on two GPUs of this machine with nccl-tests' columns, for
//! oxccl's device path and, in the same run on the same buffers and
//! streams, NCCL (loaded from `--nccl PATH`; default: PyTorch's copy).
//!
//! ```text
//! gpu_bench [--coll all_reduce|all_gather|reduce_scatter|broadcast|reduce]
//!           [--min 8] [--max 1G] [--sizes 1M,64M,...] [--iters 20] [--warmup 5]
//!           [--nccl PATH|none] [--config CH,THREADS,SLOT_K,CHANNEL_K,MIN_SLICE_K]...
//! ```
//! Each rank is driven by its own thread (nccl-tests' `-t 2`). Times are
//! per operation, averaged over back-to-back launches after a warm-up;
//! busbw = algbw times 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
//! reduce-scatter) or 1. `--config` (repeatable) instead prints one line of
//! busbw per device configuration, for tuning. The data is float sum.

use std::ffi::c_void;
use std::sync::Barrier;

use oxccl::cuda::{DeviceBuffer, Event, FillPattern, Stream};
use oxccl::exec::device::{ChannelChoice, DeviceComm, DeviceConfig, LocalOob, Oob};
use oxccl::{DataType, RedOp};

const N: usize = 2;
const DEFAULT_NCCL: &str =
    "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
}

impl Coll {
    fn parse(s: &str) -> Coll {
        match s {
            "all_reduce" => Coll::AllReduce,
            "all_gather" => Coll::AllGather,
            "reduce_scatter" => Coll::ReduceScatter,
            "broadcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            _ => panic!("unknown collective {s}"),
        }
    }

    fn factor(self) -> f64 {
        let n = N as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
        }
    }

    /// NCCL's count for a size in bytes (nccl-tests: the larger buffer).
    fn count(self, bytes: usize) -> usize {
        match self {
            Coll::AllGather | Coll::ReduceScatter => bytes / 4 / N,
            _ => bytes / 4,
        }
    }
}

struct Args {
    coll: Coll,
    sizes: Vec<usize>,
    iters: usize,
    warmup: usize,
    nccl: Option<String>,
    configs: Vec<DeviceConfig>,
}

fn size(s: &str) -> usize {
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().expect("a size") * mult
}

fn args() -> Args {
    let base = DeviceConfig::from_env().expect("OXCCL_DEV_* settings");
    let (mut min, mut max) = (8, 1 << 30);
    let mut a = Args {
        coll: Coll::AllReduce,
        sizes: Vec::new(),
        iters: 20,
        warmup: 5,
        nccl: Some(DEFAULT_NCCL.into()),
        configs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().expect("a value after the flag");
        match k.as_str() {
            "--coll" => a.coll = Coll::parse(&v()),
            "--min" => min = size(&v()),
            "--max" => max = size(&v()),
            "--sizes" => a.sizes = v().split(',').map(size).collect(),
            "--iters" => a.iters = v().parse().expect("a number"),
            "--warmup" => a.warmup = v().parse().expect("a number"),
            "--nccl" => {
                let p = v();
                a.nccl = (p != "none").then_some(p);
            }
            "--config" => {
                let f: Vec<usize> = v()
                    .split(',')
                    .map(|x| x.parse().expect("a number"))
                    .collect();
                let c = DeviceConfig {
                    channels: f[0],
                    choice: ChannelChoice::Fixed,
                    threads: f[1] as u32,
                    slot_bytes: f[2] << 10,
                    channel_bytes: f[3] << 10,
                    min_slice_bytes: f[4] << 10,
                    ..base.clone()
                };
                c.validate().expect("a valid configuration");
                a.configs.push(c);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if a.sizes.is_empty() {
        let mut b = min.max(4 * N);
        while b <= max {
            a.sizes.push(b);
            b *= 2;
        }
    }
    if a.configs.is_empty() {
        a.configs.push(base);
    }
    a
}

/// Both ranks' communicators (setup exchanges, so one thread each).
fn comms(cfg: &DeviceConfig) -> Vec<DeviceComm> {
    let oobs = LocalOob::group(N);
    std::thread::scope(|s| {
        let hs: Vec<_> = oobs
            .iter()
            .map(|o| s.spawn(move || DeviceComm::new(o, o.rank(), cfg.clone()).expect("comm")))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank r's input: small integers, exact in float sums.
fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 1,
        modulus: 13,
        offset: -6,
    }
}

struct Rank {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stream: Stream,
    start: Event,
    end: Event,
}

impl Rank {
    fn new(c: &DeviceComm, max: usize) -> Rank {
        let ctx = c.context();
        let r = Rank {
            send: DeviceBuffer::alloc(ctx, max).unwrap(),
            recv: DeviceBuffer::alloc(ctx, max).unwrap(),
            stream: Stream::new(ctx).unwrap(),
            start: Event::new(ctx, true).unwrap(),
            end: Event::new(ctx, true).unwrap(),
        };
        r.refill(c);
        r
    }

    /// In place overwrites the input: refill before anything is checked.
    fn refill(&self, c: &DeviceComm) {
        let n = self.send.len() / 4;
        let s = self.stream.handle();
        let k = c.kernels();
        k.fill(self.send.ptr(), n, DataType::Float32, pattern(c.rank()), s)
            .unwrap();
        self.stream.synchronize().unwrap();
    }

    /// (send, recv) addresses, in place by NCCL's rules.
    fn bufs(&self, coll: Coll, count: usize, rank: usize, in_place: bool) -> (u64, u64) {
        let (s, r) = (self.send.ptr(), self.recv.ptr());
        let block = (rank * count * 4) as u64;
        match (in_place, coll) {
            (false, _) => (s, r),
            (true, Coll::AllGather) => (r + block, r),
            (true, Coll::ReduceScatter) => (s, s + block),
            (true, _) => (s, s),
        }
    }
}

/// Microseconds per operation: every rank's thread runs `warmup` then
/// `iters` operations between two events; the slowest rank counts.
fn time<F: FnMut() + Send>(rs: &[Rank], iters: usize, warmup: usize, ops: Vec<F>) -> f64 {
    let barrier = Barrier::new(N);
    let ms: Vec<f64> = std::thread::scope(|sc| {
        let hs: Vec<_> = ops
            .into_iter()
            .zip(rs)
            .map(|(mut op, r)| {
                let barrier = &barrier;
                sc.spawn(move || {
                    for _ in 0..warmup {
                        op();
                    }
                    r.stream.synchronize().unwrap();
                    barrier.wait();
                    r.start.record(r.stream.handle()).unwrap();
                    for _ in 0..iters {
                        op();
                    }
                    r.end.record(r.stream.handle()).unwrap();
                    r.end.synchronize().unwrap();
                    r.end.elapsed_ms_since(&r.start).unwrap() as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    ms.into_iter().fold(0.0, f64::max) * 1000.0 / iters as f64
}

/// Wrong elements of an out-of-place all-reduce of the fills.
fn wrong(rs: &[Rank], count: usize) -> usize {
    let mut w = 0;
    for r in rs {
        let mut out = vec![0u8; count * 4];
        r.recv.read(0, &mut out).unwrap();
        for (i, b) in out.chunks(4).enumerate() {
            let want: f32 = (0..N).map(|p| pattern(p).value(i) as f32).sum();
            if f32::from_ne_bytes(b.try_into().unwrap()) != want {
                w += 1;
            }
        }
    }
    w
}

fn iters_for(bytes: usize, base: usize) -> usize {
    // Small messages get more iterations, so that the average spans a few
    // milliseconds at least.
    base.max(((64 << 20) / bytes.max(1)).min(1000))
}

fn header(title: &str) {
    println!("# {title}");
    println!(
        "#{:>12} {:>12} {:>6} {:>6} {:>5}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "#{:>12} {:>12} {:>6} {:>6} {:>5}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

fn row(coll: Coll, bytes: usize, out: f64, inp: f64, wrong: Option<usize>) {
    let bw = |us: f64| bytes as f64 / us / 1e3;
    let w = wrong.map_or("N/A".to_string(), |w| w.to_string());
    let root = if matches!(coll, Coll::Broadcast | Coll::Reduce) {
        0
    } else {
        -1
    };
    println!(" {:>12} {:>12} {:>6} {:>6} {:>5}  {:>9.2} {:>7.2} {:>7.2} {:>6}  {:>9.2} {:>7.2} {:>7.2} {:>6}",
        bytes, coll.count(bytes), "float", "sum", root, out, bw(out), bw(out) * coll.factor(), w,
        inp, bw(inp), bw(inp) * coll.factor(), "N/A");
}

/// One closure per rank enqueuing that rank's operation.
fn ops_oxccl<'a>(
    cs: &'a mut [DeviceComm],
    rs: &'a [Rank],
    coll: Coll,
    count: usize,
    in_place: bool,
) -> Vec<impl FnMut() + Send + 'a> {
    cs.iter_mut()
        .zip(rs)
        .enumerate()
        .map(move |(rank, (c, r))| {
            let (send, recv) = r.bufs(coll, count, rank, in_place);
            let s = r.stream.handle();
            let f = DataType::Float32;
            move || {
                match coll {
                    Coll::AllReduce => c.all_reduce(send, recv, count, f, RedOp::Sum, s),
                    Coll::AllGather => c.all_gather(send, recv, count, f, s),
                    Coll::ReduceScatter => c.reduce_scatter(send, recv, count, f, RedOp::Sum, s),
                    Coll::Broadcast => c.broadcast(send, recv, count, f, 0, s),
                    Coll::Reduce => c.reduce(send, recv, count, f, RedOp::Sum, 0, s),
                }
                .unwrap()
            }
        })
        .collect()
}

fn bench_oxccl(a: &Args, cfg: &DeviceConfig, print: bool) -> Vec<f64> {
    let mut cs = comms(cfg);
    let rs: Vec<Rank> = cs
        .iter()
        .map(|c| Rank::new(c, *a.sizes.last().unwrap()))
        .collect();
    if print {
        header(&format!(
            "oxccl {:?}: {} channels x {} threads, {} slots x {} KiB, a channel per {} KiB, slices >= {} KiB",
            a.coll,
            cfg.channels,
            cfg.threads,
            cfg.slots,
            cfg.slot_bytes >> 10,
            cfg.channel_bytes >> 10,
            cfg.min_slice_bytes >> 10
        ));
    }
    let mut busbw = Vec::new();
    for &bytes in &a.sizes {
        let (coll, count) = (a.coll, a.coll.count(bytes));
        let iters = iters_for(bytes, a.iters);
        let out = time(
            &rs,
            iters,
            a.warmup,
            ops_oxccl(&mut cs, &rs, coll, count, false),
        );
        let w = (coll == Coll::AllReduce && bytes <= 256 << 20).then(|| wrong(&rs, count));
        let inp = time(
            &rs,
            iters,
            a.warmup,
            ops_oxccl(&mut cs, &rs, coll, count, true),
        );
        for (c, r) in cs.iter().zip(&rs) {
            r.refill(c);
        }
        if print {
            row(coll, bytes, out, inp, w);
        }
        busbw.push(bytes as f64 / out / 1e3 * coll.factor());
    }
    busbw
}

type NcclFn = unsafe extern "C" fn() -> i32;

/// NCCL through its C ABI, on our buffers and streams.
struct Nccl {
    _lib: libloading::Library,
    comms: [usize; N],
    all_reduce: NcclFn,
    all_gather: NcclFn,
    reduce_scatter: NcclFn,
    broadcast: NcclFn,
    reduce: NcclFn,
}

impl Nccl {
    fn load(path: &str) -> Result<Nccl, String> {
        // SAFETY: loading NCCL runs its initialisers, which only set up the library.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{path}: {e}"))?;
        let sym = |name: &[u8]| -> Result<NcclFn, String> {
            // SAFETY: only read as an address here; each is cast to its nccl.h
            // signature before it is called.
            unsafe {
                lib.get::<NcclFn>(name)
                    .map(|s| *s)
                    .map_err(|e| e.to_string())
            }
        };
        let init = sym(b"ncclCommInitAll")?;
        let mut comms = [0usize; N];
        let devs: Vec<i32> = (0..N as i32).collect();
        // SAFETY: ncclCommInitAll(ncclComm_t*, int, const int*) per nccl.h; the
        // arrays hold N entries.
        let r = unsafe {
            let f: unsafe extern "C" fn(*mut usize, i32, *const i32) -> i32 =
                std::mem::transmute(init);
            f(comms.as_mut_ptr(), N as i32, devs.as_ptr())
        };
        if r != 0 {
            return Err(format!("ncclCommInitAll: error {r}"));
        }
        Ok(Nccl {
            all_reduce: sym(b"ncclAllReduce")?,
            all_gather: sym(b"ncclAllGather")?,
            reduce_scatter: sym(b"ncclReduceScatter")?,
            broadcast: sym(b"ncclBroadcast")?,
            reduce: sym(b"ncclReduce")?,
            comms,
            _lib: lib,
        })
    }

    /// Enqueues one rank's operation (float = 7, sum = 0 in nccl.h).
    fn op(&self, coll: Coll, rank: usize, send: u64, recv: u64, count: usize, stream: u64) -> i32 {
        type P = *mut c_void;
        let (s, r, c, st) = (send as P, recv as P, self.comms[rank] as P, stream as P);
        // SAFETY: each function has the signature of nccl.h it is cast to; the
        // communicator is live; the buffers hold the counts on its GPU.
        unsafe {
            match coll {
                Coll::AllReduce => {
                    let f: unsafe extern "C" fn(P, P, usize, i32, i32, P, P) -> i32 =
                        std::mem::transmute(self.all_reduce);
                    f(s, r, count, 7, 0, c, st)
                }
                Coll::AllGather => {
                    let f: unsafe extern "C" fn(P, P, usize, i32, P, P) -> i32 =
                        std::mem::transmute(self.all_gather);
                    f(s, r, count, 7, c, st)
                }
                Coll::ReduceScatter => {
                    let f: unsafe extern "C" fn(P, P, usize, i32, i32, P, P) -> i32 =
                        std::mem::transmute(self.reduce_scatter);
                    f(s, r, count, 7, 0, c, st)
                }
                Coll::Broadcast => {
                    let f: unsafe extern "C" fn(P, P, usize, i32, i32, P, P) -> i32 =
                        std::mem::transmute(self.broadcast);
                    f(s, r, count, 7, 0, c, st)
                }
                Coll::Reduce => {
                    let f: unsafe extern "C" fn(P, P, usize, i32, i32, i32, P, P) -> i32 =
                        std::mem::transmute(self.reduce);
                    f(s, r, count, 7, 0, 0, c, st)
                }
            }
        }
    }
}

fn ops_nccl<'a>(
    nccl: &'a Nccl,
    rs: &'a [Rank],
    coll: Coll,
    count: usize,
    in_place: bool,
) -> Vec<impl FnMut() + Send + 'a> {
    rs.iter()
        .enumerate()
        .map(move |(rank, r)| {
            let (send, recv) = r.bufs(coll, count, rank, in_place);
            let s = r.stream.handle().raw();
            move || assert_eq!(nccl.op(coll, rank, send, recv, count, s), 0, "NCCL error")
        })
        .collect()
}

fn bench_nccl(a: &Args, nccl: &Nccl, cs: &[DeviceComm]) {
    let rs: Vec<Rank> = cs
        .iter()
        .map(|c| Rank::new(c, *a.sizes.last().unwrap()))
        .collect();
    header(&format!("NCCL {:?}, same buffers and streams", a.coll));
    for &bytes in &a.sizes {
        let (coll, count) = (a.coll, a.coll.count(bytes));
        let iters = iters_for(bytes, a.iters);
        let out = time(
            &rs,
            iters,
            a.warmup,
            ops_nccl(nccl, &rs, coll, count, false),
        );
        let w = (coll == Coll::AllReduce && bytes <= 256 << 20).then(|| wrong(&rs, count));
        let inp = time(&rs, iters, a.warmup, ops_nccl(nccl, &rs, coll, count, true));
        for (c, r) in cs.iter().zip(&rs) {
            r.refill(c);
        }
        row(coll, bytes, out, inp, w);
    }
}

fn main() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // NVLink multicast can take shared GPUs down; never let NCCL use it here.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let a = args();
    match oxccl::cuda::device_count() {
        Ok(n) if n >= N => {}
        Ok(n) => return println!("skipped: {n} GPU(s), {N} needed"),
        Err(e) => return println!("skipped: {e}"),
    }
    let t = std::time::Instant::now();
    if a.configs.len() > 1 {
        let sizes: Vec<String> = a.sizes.iter().map(|b| format!("{:>8}", b >> 10)).collect();
        println!(
            "# {:?} busbw (GB/s) per config; sizes in KiB: {}",
            a.coll,
            sizes.join("")
        );
        for cfg in &a.configs {
            let bw = bench_oxccl(&a, cfg, false);
            let cols: Vec<String> = bw.iter().map(|b| format!("{b:>8.1}")).collect();
            println!(
                "# ch {:>3} thr {:>4} slot {:>4}K chan {:>4}K slice {:>4}K: {}",
                cfg.channels,
                cfg.threads,
                cfg.slot_bytes >> 10,
                cfg.channel_bytes >> 10,
                cfg.min_slice_bytes >> 10,
                cols.join("")
            );
        }
    } else {
        bench_oxccl(&a, &a.configs[0], true);
        if let Some(p) = &a.nccl {
            match Nccl::load(p) {
                Ok(nccl) => bench_nccl(&a, &nccl, &comms(&a.configs[0])),
                Err(e) => println!("# NCCL not measured: {e}"),
            }
        }
    }
    println!("# done in {:.1} s", t.elapsed().as_secs_f64());
}
