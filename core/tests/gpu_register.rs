//! Registered buffers (ncclCommRegister) on two ranks that are threads of
//! this process, on two GPUs or sharing one (then with
//! OXCCL_SHARED_GPU=kernels, so that the ring kernels run rather than the
//! shared-GPU launches): all_gather, broadcast, all_reduce and a group of
//! sends and receives, registered and not, from cuMemAlloc and from
//! ncclMemAlloc's virtual-memory allocations, against the host's
//! reference on random data, outputs poisoned first. A registered run
//! must take the direct path (the peer reads the buffer where it lies:
//! `DeviceComm::direct_launches` grows), an unregistered one must not.
//! Then the refusals: host memory, a range past its allocation, an
//! unknown handle, a buffer freed under its registration.

mod gpu_common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};

use gpu_common::{inputs, two_ranks, with_ranks, Rank, NRANKS};
use oxccl::algo::{Algo, Coll};
use oxccl::cuda::{vmm, DeviceBuffer};
use oxccl::exec::device::{Choice, DeviceConfig};
use oxccl::{DataType, Error, RedOp};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    AllGather,
    Broadcast(usize),
    AllReduce,
    SendRecv,
}

impl Kind {
    /// Elements of input and output per rank.
    fn sizes(self, count: usize) -> (usize, usize) {
        match self {
            Kind::AllGather => (count, NRANKS * count),
            _ => (count, count),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    id: usize,
    kind: Kind,
    dtype: DataType,
    registered: bool,
    in_place: bool,
    count: usize,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for kind in [
        Kind::AllGather,
        Kind::Broadcast(0),
        Kind::Broadcast(1),
        Kind::AllReduce,
        Kind::SendRecv,
    ] {
        for dtype in [DataType::Float32, DataType::Bfloat16, DataType::Int8] {
            for registered in [true, false] {
                for in_place in [false, true] {
                    if in_place && kind == Kind::SendRecv {
                        continue;
                    }
                    for count in [1, 7, 4099, 1_000_003, 8 << 20] {
                        let id = v.len();
                        v.push(Case {
                            id,
                            kind,
                            dtype,
                            registered,
                            in_place,
                            count,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Where ranks share one GPU, the ring kernels rather than the shared-GPU
/// path (which reads every rank's buffers in one launch anyway).
fn kernels_on_one_gpu() {
    if oxccl::cuda::device_count().unwrap_or(0) < NRANKS {
        std::env::set_var("OXCCL_SHARED_GPU", "kernels");
    }
}

/// A buffer of either allocator.
enum Mem {
    Plain(DeviceBuffer),
    Vmm(u64),
}

impl Mem {
    fn ptr(&self) -> u64 {
        match self {
            Mem::Plain(b) => b.ptr(),
            Mem::Vmm(p) => *p,
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Mem::Vmm(p) = *self {
            // SAFETY: the test synchronized its streams; nothing uses it.
            let _ = unsafe { vmm::vmm_free(p) };
        }
    }
}

fn write(ptr: u64, data: &[u8], r: &Rank) {
    // A plain copy through a temporary buffer works for both allocators.
    let tmp = DeviceBuffer::alloc(r.comm.context(), data.len().max(1)).unwrap();
    tmp.write(0, data).unwrap();
    r.comm
        .copy(ptr, tmp.ptr(), data.len(), r.stream.handle())
        .unwrap();
    r.stream.synchronize().unwrap();
}

fn read(ptr: u64, out: &mut [u8], r: &Rank) {
    let tmp = DeviceBuffer::alloc(r.comm.context(), out.len().max(1)).unwrap();
    r.comm
        .copy(tmp.ptr(), ptr, out.len(), r.stream.handle())
        .unwrap();
    r.stream.synchronize().unwrap();
    tmp.read(0, out).unwrap();
}

type Shared = Mutex<HashMap<(usize, usize), Arc<Vec<u8>>>>;

/// One case on this rank: elements wrong, the direct launches it made,
/// and whether it had to make one (a registered buffer sent from through
/// the simple protocol: the LL one carries data with its flags).
fn run_case(
    r: &mut Rank,
    input: &Mem,
    output: &Mem,
    c: &Case,
    shared: &Shared,
    barrier: &Barrier,
) -> (usize, u64, bool) {
    let es = c.dtype.size();
    let (n_in, n_out) = c.kind.sizes(c.count);
    let mine = Arc::new(inputs(c.dtype, (c.id * NRANKS + r.rank) as u64 + 11, n_in));
    shared.lock().unwrap().insert((c.id, r.rank), mine.clone());
    let poison = vec![0xa5u8; n_out * es];
    write(output.ptr(), &poison, r);
    let (send, recv) = if c.in_place {
        let off = match c.kind {
            Kind::AllGather => r.rank * c.count * es,
            _ => 0,
        } as u64;
        write(output.ptr() + off, &mine, r);
        (output.ptr() + off, output.ptr())
    } else {
        write(input.ptr(), &mine, r);
        (input.ptr(), output.ptr())
    };
    let regs: Vec<u64> = if c.registered {
        let mut v = vec![r.comm.register(recv, n_out * es).unwrap()];
        if !c.in_place {
            v.push(r.comm.register(send, n_in * es).unwrap());
        }
        v
    } else {
        Vec::new()
    };
    barrier.wait();
    let before = r.comm.direct_launches();
    let s = r.stream.handle();
    let other = 1 - r.rank;
    let res = match c.kind {
        Kind::AllGather => r.comm.all_gather(send, recv, c.count, c.dtype, s),
        Kind::Broadcast(root) => r.comm.broadcast(send, recv, c.count, c.dtype, root, s),
        // The ring, whose all-gather half sends the output: with two ranks
        // the default is the exchange, which never reads in place.
        Kind::AllReduce => {
            let ch = Choice::new(Algo::Ring, r.comm.channels_for(c.count * es));
            r.comm.collective(
                Coll::AllReduce,
                Some(ch),
                send,
                recv,
                c.count,
                c.dtype,
                RedOp::Sum,
                s,
            )
        }
        Kind::SendRecv => r
            .comm
            .p2p(&[(other, send)], &[(other, recv)], c.count, c.dtype, s),
    };
    res.unwrap_or_else(|e| panic!("{c:?}: {e}"));
    r.stream
        .synchronize()
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let direct = r.comm.direct_launches() - before;
    for h in regs {
        r.comm.deregister(h).unwrap();
    }
    let mut out = vec![0u8; n_out * es];
    read(recv, &mut out, r);
    let all: Vec<Arc<Vec<u8>>> = (0..NRANKS)
        .map(|p| shared.lock().unwrap()[&(c.id, p)].clone())
        .collect();
    let want: Vec<u8> = match c.kind {
        Kind::AllGather => all.iter().flat_map(|a| a.iter().copied()).collect(),
        Kind::Broadcast(root) => all[root].to_vec(),
        Kind::SendRecv => all[other].to_vec(),
        Kind::AllReduce => {
            // Two terms: exact in f64, rounded once to the type, as the
            // kernels round it.
            let mut w = vec![0u8; n_out * es];
            for i in 0..n_out {
                let v = oxccl::reduce::load_f64(c.dtype, &all[0], i)
                    + oxccl::reduce::load_f64(c.dtype, &all[1], i);
                oxccl::reduce::store_f64(c.dtype, &mut w, i, v);
            }
            w
        }
    };
    let mut wrong = 0;
    for i in 0..n_out {
        let differs = if c.kind == Kind::AllReduce && c.dtype.is_float() {
            // One rounding of two terms: within the type's unit of the sum
            // of magnitudes.
            let got = oxccl::reduce::load_f64(c.dtype, &out, i);
            let a = oxccl::reduce::load_f64(c.dtype, &all[0], i);
            let b = oxccl::reduce::load_f64(c.dtype, &all[1], i);
            let unit = if c.dtype == DataType::Bfloat16 {
                1.6e-2
            } else {
                1e-6
            };
            (got - (a + b)).abs() > unit * (a.abs() + b.abs()) + 1e-30 || got.is_nan()
        } else {
            out[i * es..(i + 1) * es] != want[i * es..(i + 1) * es]
        };
        if differs {
            if wrong < 5 {
                println!(
                    "rank {} {c:?}: element {i}: got {:?}, want {:?}",
                    r.rank,
                    &out[i * es..(i + 1) * es],
                    &want[i * es..(i + 1) * es]
                );
            }
            wrong += 1;
        }
    }
    barrier.wait();
    if r.rank == 0 {
        shared.lock().unwrap().retain(|k, _| k.0 != c.id);
    }
    let simple = r.comm.ll_bound().is_none_or(|b| c.count * es > b);
    let sends = match c.kind {
        Kind::Broadcast(root) => root == r.rank,
        _ => true,
    };
    (wrong, direct, c.registered && simple && sends)
}

fn run_all(vmm_mem: bool) {
    kernels_on_one_gpu();
    let cases = cases();
    let max_bytes = cases
        .iter()
        .map(|c| {
            let (i, o) = c.kind.sizes(c.count);
            i.max(o) * c.dtype.size()
        })
        .max()
        .unwrap();
    let shared: Shared = Mutex::new(HashMap::new());
    let results = with_ranks(DeviceConfig::from_env().unwrap(), |r, barrier| {
        let ctx = r.comm.context().clone();
        let alloc = || {
            if vmm_mem {
                let dev = ctx.device().ordinal();
                Mem::Vmm(vmm::vmm_alloc(dev, max_bytes).unwrap())
            } else {
                Mem::Plain(DeviceBuffer::alloc(&ctx, max_bytes).unwrap())
            }
        };
        let (input, output) = (alloc(), alloc());
        let mut bad = Vec::new();
        let (mut direct_reg, mut direct_unreg) = (0u64, 0u64);
        for c in &cases {
            let (wrong, direct, expected) = run_case(r, &input, &output, c, &shared, barrier);
            if wrong > 0 {
                bad.push(format!("rank {}: {c:?}: {wrong} wrong", r.rank));
            }
            if c.registered {
                direct_reg += direct;
                if expected && direct == 0 {
                    bad.push(format!(
                        "rank {}: {c:?}: registered, but no launch read in place",
                        r.rank
                    ));
                }
            } else {
                direct_unreg += direct;
                if direct != 0 {
                    bad.push(format!(
                        "rank {}: {c:?}: unregistered, yet {direct} launch(es) read in place",
                        r.rank
                    ));
                }
            }
        }
        println!(
            "rank {} ({}): {} cases, direct launches: {direct_reg} registered, {direct_unreg} unregistered; {} bad",
            r.rank,
            if vmm_mem { "ncclMemAlloc memory" } else { "cuMemAlloc memory" },
            cases.len(),
            bad.len()
        );
        assert_eq!(r.comm.registered(), 0);
        bad
    });
    let bad: Vec<&String> = results.iter().flatten().collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn registered_and_unregistered_match_the_reference() {
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    run_all(false);
}

#[test]
fn registered_vmm_memory_matches_the_reference() {
    let Some((_gpus, devices)) = two_ranks() else {
        return;
    };
    let dev = oxccl::cuda::Device::get(devices[0]).unwrap();
    if !vmm::vmm_supported(&dev).unwrap_or(false) {
        println!(
            "skipped: GPU {} has no virtual memory management",
            devices[0]
        );
        return;
    }
    run_all(true);
}

#[test]
fn what_cannot_be_registered_is_refused() {
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    kernels_on_one_gpu();
    let results = with_ranks(DeviceConfig::from_env().unwrap(), |r, barrier| {
        let ctx = r.comm.context().clone();
        // Pageable host memory.
        let host = vec![0u8; 4096];
        let e = r
            .comm
            .register(host.as_ptr() as u64, host.len())
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("only device memory"), "{e}");
        // Past its allocation.
        let b = DeviceBuffer::alloc(&ctx, 1 << 20).unwrap();
        let e = r.comm.register(b.ptr() + 4096, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("runs past its allocation"), "{e}");
        // An unknown handle, and one released twice.
        let e = r.comm.deregister(0xdead_beef).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let h = r.comm.register(b.ptr(), 1 << 20).unwrap();
        r.comm.deregister(h).unwrap();
        assert!(r.comm.deregister(h).is_err());
        // Freed under its registration: every rank's call is refused
        // before anything is launched, and the communicator still works.
        let count = 1024;
        let gone = DeviceBuffer::alloc(&ctx, count * 4 * NRANKS).unwrap();
        let (gp, glen) = (gone.ptr(), gone.len());
        let h = r.comm.register(gp, glen).unwrap();
        drop(gone);
        // Perhaps the same addresses, another allocation.
        let again = DeviceBuffer::alloc(&ctx, count * 4 * NRANKS).unwrap();
        barrier.wait();
        let s = r.stream.handle();
        let e = r
            .comm
            .all_gather(gp, gp, count, DataType::Float32, s)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(e.to_string().contains("freed while registered"), "{e}");
        r.comm.deregister(h).unwrap();
        barrier.wait();
        // The communicator still runs collectives.
        let out = DeviceBuffer::alloc(&ctx, count * 4 * NRANKS).unwrap();
        r.comm
            .all_gather(again.ptr(), out.ptr(), count, DataType::Float32, s)
            .unwrap();
        r.stream.synchronize().unwrap();
        r.comm.registered()
    });
    assert_eq!(results, vec![0; NRANKS]);
}
