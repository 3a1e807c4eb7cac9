//! Collectives, point-to-point and the operators they reduce with. Each
//! call is queued in the thread's group, or runs at once outside one; on a
//! GPU communicator it is enqueued on `stream` and returns without waiting.

use std::os::raw::{c_int, c_void};

use oxccl::win::ce::CeColl;
use oxccl::{DataType, Error, Op, OpKind, RedOp};

use crate::collconfig::{self, Func};

use crate::guard::{entry, ok, Outcome};
use crate::handle::{self, Handle};
use crate::types::*;

fn rank_arg(what: &str, v: c_int) -> Result<usize, Error> {
    usize::try_from(v).map_err(|_| Error::InvalidArgument(format!("{what} {v} is negative")))
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn enqueue(
    h: &Handle,
    kind: OpKind,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: RedOp,
    stream: cudaStream_t,
    pc: collconfig::PerCall,
) -> Outcome {
    let op = Op {
        kind,
        input: sendbuff.cast(),
        output: recvbuff.cast(),
        count,
        dtype: DataType::from_raw(datatype)?,
        redop: op,
        stream: stream as u64,
        user_tag: pc.user_tag,
        call: pc.call,
    };
    // SAFETY: NCCL's contract: the buffers hold what the operation needs
    // and stay untouched until it completes (on the stream for device
    // memory; by the end of the call or group for host memory).
    unsafe { h.comm.enqueue(op) }?;
    ok()
}

/// Runs an all_gather or all_to_all on the copy engine where
/// `oxccl::win::ce` chooses it (output in a symmetric window, the CTA
/// policy or OXCCL_CE_COLL); `false`: the caller enqueues it as usual.
/// `bytes`: each rank's block.
fn on_copy_engine(
    h: &Handle,
    coll: CeColl,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    bytes: usize,
    stream: cudaStream_t,
) -> Result<bool, Error> {
    // SAFETY: NCCL's contract: the stream is a live stream of the
    // communicator's GPU (or 0), and the buffers hold what the collective
    // needs until the stream has run it.
    unsafe {
        let s = oxccl::cuda::RawStream::from_raw(stream as u64);
        oxccl::win::ce::try_run(&h.comm, coll, sendbuff as u64, recvbuff as u64, bytes, s)
    }
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn all_reduce(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let op = h.redop(op)?;
        let pc = collconfig::read(config, &h.comm, Func::AllReduce)?;
        enqueue(
            &h,
            OpKind::AllReduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            stream,
            pc,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    all_reduce(
        "ncclAllReduce",
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclAllReduce` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclAllReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    all_reduce(
        "ncclAllReduceConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        comm,
        stream,
        config,
    )
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn broadcast(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let root = rank_arg("root", root)?;
        let pc = collconfig::read(config, &h.comm, Func::Broadcast)?;
        enqueue(
            &h,
            OpKind::Broadcast { root },
            sendbuff,
            recvbuff,
            count,
            datatype,
            RedOp::Sum,
            stream,
            pc,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    broadcast(
        "ncclBroadcast",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclBroadcast` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclBroadcastConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    broadcast(
        "ncclBroadcastConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        config,
    )
}

/// Broadcast in place (NCCL's legacy name).
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    ncclBroadcast(buff, buff, count, datatype, root, comm, stream)
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn reduce(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let op = h.redop(op)?;
        let root = rank_arg("root", root)?;
        let pc = collconfig::read(config, &h.comm, Func::Reduce)?;
        enqueue(
            &h,
            OpKind::Reduce { root },
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            stream,
            pc,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    reduce(
        "ncclReduce",
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        root,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclReduce` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    reduce(
        "ncclReduceConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        root,
        comm,
        stream,
        config,
    )
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn all_gather(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let pc = collconfig::read(config, &h.comm, Func::AllGather)?;
        let bytes = sendcount
            .checked_mul(DataType::from_raw(datatype)?.size())
            .ok_or_else(|| Error::InvalidArgument(format!("count {sendcount} is too large")))?;
        if on_copy_engine(&h, CeColl::AllGather, sendbuff, recvbuff, bytes, stream)? {
            return ok();
        }
        enqueue(
            &h,
            OpKind::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            RedOp::Sum,
            stream,
            pc,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    all_gather(
        "ncclAllGather",
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclAllGather` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclAllGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    all_gather(
        "ncclAllGatherConfig",
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        comm,
        stream,
        config,
    )
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn reduce_scatter(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let op = h.redop(op)?;
        let pc = collconfig::read(config, &h.comm, Func::ReduceScatter)?;
        enqueue(
            &h,
            OpKind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
            stream,
            pc,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    reduce_scatter(
        "ncclReduceScatter",
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        op,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclReduceScatter` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclReduceScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    reduce_scatter(
        "ncclReduceScatterConfig",
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        op,
        comm,
        stream,
        config,
    )
}

#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("ncclSend", || {
        let h = handle::get(comm)?;
        let peer = rank_arg("peer", peer)?;
        enqueue(
            &h,
            OpKind::Send { peer },
            sendbuff,
            std::ptr::null_mut(),
            count,
            datatype,
            RedOp::Sum,
            stream,
            collconfig::PerCall::default(),
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("ncclRecv", || {
        let h = handle::get(comm)?;
        let peer = rank_arg("peer", peer)?;
        enqueue(
            &h,
            OpKind::Recv { peer },
            std::ptr::null(),
            recvbuff,
            count,
            datatype,
            RedOp::Sum,
            stream,
            collconfig::PerCall::default(),
        )
    })
}

/// The sends and receives of a rooted or all-to-all exchange, in one group.
/// `send_to(p)`/`recv_from(p)` say which blocks move; blocks are `count`
/// elements at `p * count` of the buffer.
#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn exchange(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: (*const ncclCollConfig_t, Func),
    send_to: impl Fn(usize, usize) -> Option<usize>,
    recv_from: impl Fn(usize, usize) -> Option<usize>,
) -> ncclResult_t {
    entry(name, || {
        let h = handle::get(comm)?;
        let dtype = DataType::from_raw(datatype)?;
        let pc = collconfig::read(config.0, &h.comm, config.1)?;
        let (me, n) = (h.comm.user_rank(), h.comm.count());
        let block = count
            .checked_mul(dtype.size())
            .filter(|b| b.checked_mul(n).is_some());
        let block = block.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "count {count} of {} overflows with {n} ranks",
                dtype.name()
            ))
        })?;
        if config.1 == Func::AlltoAll
            && on_copy_engine(&h, CeColl::AllToAll, sendbuff, recvbuff, block, stream)?
        {
            return ok();
        }
        oxccl::group_start();
        let mut r = Ok(());
        for p in 0..n {
            if let Some(b) = send_to(me, p) {
                r = r.and_then(|_| {
                    enqueue(
                        &h,
                        OpKind::Send { peer: p },
                        sendbuff.cast::<u8>().wrapping_add(b * block).cast(),
                        std::ptr::null_mut(),
                        count,
                        datatype,
                        RedOp::Sum,
                        stream,
                        pc,
                    )
                    .map(|_| ())
                });
            }
            if let Some(b) = recv_from(me, p) {
                r = r.and_then(|_| {
                    enqueue(
                        &h,
                        OpKind::Recv { peer: p },
                        std::ptr::null(),
                        recvbuff.cast::<u8>().wrapping_add(b * block).cast(),
                        count,
                        datatype,
                        RedOp::Sum,
                        stream,
                        pc,
                    )
                    .map(|_| ())
                });
            }
        }
        // The group closes whether or not a call above failed, so the
        // thread's group depth stays balanced.
        let end = oxccl::group_end();
        r.and(end)?;
        ok()
    })
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn all_to_all(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    exchange(
        name,
        sendbuff,
        recvbuff,
        count,
        datatype,
        comm,
        stream,
        (config, Func::AlltoAll),
        |_, p| Some(p),
        |_, p| Some(p),
    )
}

/// Block p of every rank's sendbuff goes to rank p's recvbuff block of the sender.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    all_to_all(
        "ncclAlltoAll",
        sendbuff,
        recvbuff,
        count,
        datatype,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclAlltoAll` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclAlltoAllConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    all_to_all(
        "ncclAlltoAllConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        comm,
        stream,
        config,
    )
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn gather(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    let root = usize::try_from(root).unwrap_or(usize::MAX);
    exchange(
        name,
        sendbuff,
        recvbuff,
        count,
        datatype,
        comm,
        stream,
        (config, Func::Gather),
        move |_, p| (p == root).then_some(0),
        move |me, p| (me == root).then_some(p),
    )
}

#[no_mangle]
pub extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    gather(
        "ncclGather",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclGather` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    gather(
        "ncclGatherConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        config,
    )
}

#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
fn scatter(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    let root = usize::try_from(root).unwrap_or(usize::MAX);
    exchange(
        name,
        sendbuff,
        recvbuff,
        count,
        datatype,
        comm,
        stream,
        (config, Func::Scatter),
        move |me, p| (me == root).then_some(p),
        move |_, p| (p == root).then_some(0),
    )
}

#[no_mangle]
pub extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    scatter(
        "ncclScatter",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        std::ptr::null(),
    )
}

/// `ncclScatter` with the call's own settings (NULL: none).
#[no_mangle]
pub extern "C" fn ncclScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    scatter(
        "ncclScatterConfig",
        sendbuff,
        recvbuff,
        count,
        datatype,
        root,
        comm,
        stream,
        config,
    )
}

/// A sum whose inputs are first multiplied by `*scalar`. The scalar is read
/// when the operator is created, also from device memory
/// (`ncclScalarDevice`), where NCCL reads it when each collective runs.
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    entry("ncclRedOpCreatePreMulSum", || {
        let h = handle::get(comm)?;
        let dtype = DataType::from_raw(datatype)?;
        if op.is_null() || scalar.is_null() {
            return Err(Error::InvalidArgument(format!(
                "op ({op:p}) and scalar ({scalar:p}) must not be NULL"
            )));
        }
        let mut raw = [0u8; 8];
        let bytes = &mut raw[..dtype.size()];
        match residence {
            ncclScalarHostImmediate => {
                // SAFETY: a non-null host scalar of the datatype's size, by NCCL's contract.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        scalar.cast::<u8>(),
                        bytes.as_mut_ptr(),
                        bytes.len(),
                    )
                }
            }
            ncclScalarDevice => {
                // SAFETY: a device scalar of the datatype's size, by NCCL's contract.
                unsafe { oxccl::cuda::read_raw(scalar as u64, bytes) }?
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                "residence {other} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)"
            )))
            }
        }
        let value = oxccl::reduce::load_f64(dtype, &raw, 0);
        let mut ops = h.redops.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match ops.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                ops.push(None);
                ops.len() - 1
            }
        };
        ops[slot] = Some(RedOp::PreMulSum(value));
        let v = ncclNumOps as usize + slot;
        // SAFETY: non-null (checked); NCCL's contract makes it writable.
        unsafe { op.write(v as ncclRedOp_t) };
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    entry("ncclRedOpDestroy", || {
        let h = handle::get(comm)?;
        h.redop(op)?;
        if op < ncclNumOps {
            return Err(Error::InvalidArgument(format!(
                "op {op} is a built-in operator: only operators from ncclRedOpCreatePreMulSum are destroyed"
            )));
        }
        let mut ops = h.redops.lock().unwrap_or_else(|p| p.into_inner());
        ops[(op - ncclNumOps) as usize] = None;
        ok()
    })
}
