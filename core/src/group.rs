//! Groups: operations collected between `group_start` and `group_end`
//! (nesting counts) and run together, across communicators.
//!
//! Two front ends share one runner: the thread's group, for callers that
//! hand buffers by address (the C API's `ncclGroupStart`/`ncclGroupEnd`),
//! and [`Group`], a builder whose lifetime keeps borrowed slices alive
//! until it runs.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::comm::{check_extent, Comm, Core};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{ApiEvents, GroupApi, Handle};

pub(crate) struct Task {
    comm: Comm,
    core: Arc<Core>,
    op: Op,
    bufs: OpBuffers,
    /// The API event of the call that queued it (profiler v5+).
    api: Handle,
}

/// The profiler's API events of one outermost group: its group API event,
/// started at the first operation queued (NCCL starts it in the first task
/// append, with `ncclGroupDepth` then: 1 for a lone call's implicit group,
/// 2 in one explicit group), and each call's event.
#[derive(Default)]
struct Api(Option<GroupApi>);

impl Api {
    /// The API events of one call: the group's on its first, then the
    /// call's own (started and stopped here, within the call).
    fn call(&mut self, core: &Core, op: &Op, depth: usize) -> Handle {
        let Some(prof) = core.profiler() else {
            return Handle::NONE;
        };
        let g = self
            .0
            .get_or_insert_with(|| GroupApi::start(prof, depth as i32));
        g.call(prof, op)
    }

    /// The group's end begins; the event stops when `self` is dropped,
    /// after the group ran.
    fn ending(&self) -> Handle {
        self.0.as_ref().map_or(Handle::NONE, |g| {
            g.end_starts();
            g.handle()
        })
    }
}

#[derive(Default)]
struct Pending {
    depth: usize,
    tasks: Vec<Task>,
    api: Api,
}

thread_local! {
    static GROUP: RefCell<Pending> = RefCell::default();
}

/// Opens (or nests) the thread's group.
pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Closes one level of the thread's group; the outermost runs everything
/// queued since the outermost `group_start`.
pub fn group_end() -> Result<()> {
    let (tasks, api) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::InvalidUsage(
                "group_end without a matching group_start".into(),
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            (std::mem::take(&mut g.tasks), std::mem::take(&mut g.api))
        } else {
            (Vec::new(), Api::default())
        })
    })?;
    let group_api = api.ending();
    run_tasks(tasks, group_api)
}

/// Closes one level of the thread's group like [`group_end`], but runs
/// nothing: the outermost level drops what was queued and returns the
/// seconds the cost model predicts for it (NCCL's `ncclGroupSimulateEnd`).
pub fn group_simulate_end() -> Result<f64> {
    let tasks = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::InvalidUsage(
                "group_simulate_end without a matching group_start".into(),
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            // Nothing runs: the group API event just ends.
            g.api = Api::default();
            std::mem::take(&mut g.tasks)
        } else {
            Vec::new()
        })
    })?;
    Ok(tasks.iter().map(|t| t.core.predict(&t.op)).sum())
}

/// Nesting depth of the thread's group.
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

pub(crate) fn submit(comm: Comm, core: Arc<Core>, op: Op, bufs: OpBuffers) -> Result<()> {
    let mut task = Task {
        comm,
        core,
        op,
        bufs,
        api: Handle::NONE,
    };
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            // NCCL opens an internal group level around each call.
            let depth = g.depth + 1;
            task.api = g.api.call(&task.core, &task.op, depth);
            g.tasks.push(task);
            None
        } else {
            Some(task)
        }
    });
    match queued {
        Some(mut t) => {
            // A lone call: its own implicit group, of depth 1.
            let mut api = Api::default();
            t.api = api.call(&t.core, &t.op, 1);
            let group_api = api.ending();
            run_task(t, group_api)
        }
        None => Ok(()),
    }
}

/// Runs a group of one operation (a lone call, or every call of a loop of
/// lone calls) as [`run_tasks`] would, without its per-communicator lists.
fn run_task(t: Task, group_api: Handle) -> Result<()> {
    let api = ApiEvents::new(Some(group_api), t.api);
    run_comm(&t.comm, &t.core, &[(t.op, t.bufs)], &api)
}

/// Runs one communicator's operations of a group; a failure is recorded
/// on the communicator.
fn run_comm(comm: &Comm, core: &Core, ops: &[(Op, OpBuffers)], api: &ApiEvents) -> Result<()> {
    comm.execute_group(core, ops, api)
        .inspect_err(|e| comm.record_failure(e))
}

/// One communicator's share of a group, with the API events above it.
type PerComm = (Comm, Arc<Core>, Vec<(Op, OpBuffers)>, ApiEvents);

/// Runs tasks: each communicator's in its order, communicators at once
/// (one thread each) since each may wait on another's peers. `group_api`
/// is the group's API event (the parent of kernel launches).
fn run_tasks(mut tasks: Vec<Task>, group_api: Handle) -> Result<()> {
    if tasks.len() == 1 {
        let t = tasks.pop().expect("one task");
        return run_task(t, group_api);
    }
    let mut per_comm: Vec<PerComm> = Vec::new();
    for t in tasks {
        match per_comm
            .iter_mut()
            .find(|(_, c, _, _)| Arc::ptr_eq(c, &t.core))
        {
            Some((_, _, ops, api)) => {
                ops.push((t.op, t.bufs));
                api.push(t.api);
            }
            None => {
                let api = ApiEvents::new(Some(group_api), t.api);
                per_comm.push((t.comm, t.core, vec![(t.op, t.bufs)], api));
            }
        }
    }
    let run_one = |(comm, core, ops, api): &PerComm| run_comm(comm, core, ops, api);
    // Device operations only enqueue work, which never waits on the host:
    // one thread issues them all, in the caller's order.
    let all_device = per_comm.iter().all(|(_, c, _, _)| c.device.is_some());
    match per_comm.len() {
        0 => Ok(()),
        1 => run_one(&per_comm[0]),
        _ if all_device => per_comm.iter().try_for_each(run_one),
        _ => std::thread::scope(|s| {
            let hs: Vec<_> = per_comm
                .iter()
                .map(|pc| s.spawn(move || run_one(pc)))
                .collect();
            let results: Vec<Result<()>> = hs
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Internal("a group thread panicked".into())))
                })
                .collect();
            results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
        }),
    }
}

/// Operations on borrowed slices, run together by [`Group::run`]; may span
/// communicators (one thread driving several ranks, as with `init_all`).
pub struct Group<'a> {
    tasks: Vec<Task>,
    api: Api,
    /// NCCL's group depth at each call, for the group API event: 2 as one
    /// explicit group of calls, 1 for a lone call ([`Group::lone`]).
    depth: usize,
    /// The profiler tag given to the calls added ([`Group::user_tag`]).
    user_tag: u64,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl Default for Group<'_> {
    fn default() -> Self {
        Group::new()
    }
}

impl<'a> Group<'a> {
    pub fn new() -> Group<'a> {
        Group {
            tasks: Vec::new(),
            api: Api::default(),
            depth: 2,
            user_tag: 0,
            _borrows: PhantomData,
        }
    }

    /// The group of one call on borrowed slices (`Comm::all_reduce` …),
    /// as NCCL's implicit group around a lone call.
    pub(crate) fn lone() -> Group<'a> {
        Group {
            depth: 1,
            ..Group::new()
        }
    }

    /// Tags the calls added after this one with `tag` for the profiler
    /// (0, the default, is untagged): a v7 profiler plugin gets it on each
    /// call's API event and on its collective or p2p event, as NCCL 2.31
    /// passes `ncclCollConfig_t.userProfilerTag`. oxccl itself never reads
    /// it. Raw operations carry it in [`Op::user_tag`].
    pub fn user_tag(&mut self, tag: u64) -> &mut Self {
        self.user_tag = tag;
        self
    }

    pub(crate) fn push(&mut self, comm: &Comm, mut op: Op) -> Result<&mut Self> {
        op.user_tag = self.user_tag;
        let core = comm.core()?;
        let bufs = op.validate(comm.user_rank(), comm.count())?;
        // As one explicit group of NCCL calls: depth 2 at each call.
        let api = self.api.call(&core, &op, self.depth);
        self.tasks.push(Task {
            comm: comm.clone(),
            core,
            op,
            bufs,
            api,
        });
        Ok(self)
    }

    pub fn send(
        &mut self,
        comm: &Comm,
        input: &'a [u8],
        dtype: DataType,
        peer: usize,
    ) -> Result<&mut Self> {
        check_whole(input.len(), dtype)?;
        let op = Op {
            kind: OpKind::Send { peer },
            input: input.as_ptr(),
            output: std::ptr::null_mut(),
            count: input.len() / dtype.size(),
            dtype,
            redop: RedOp::Sum,
            stream: 0,
            user_tag: 0,
            call: Default::default(),
        };
        self.push(comm, op)
    }

    pub fn recv(
        &mut self,
        comm: &Comm,
        output: &'a mut [u8],
        dtype: DataType,
        peer: usize,
    ) -> Result<&mut Self> {
        check_whole(output.len(), dtype)?;
        let op = Op {
            kind: OpKind::Recv { peer },
            input: std::ptr::null(),
            output: output.as_mut_ptr(),
            count: output.len() / dtype.size(),
            dtype,
            redop: RedOp::Sum,
            stream: 0,
            user_tag: 0,
            call: Default::default(),
        };
        self.push(comm, op)
    }

    pub fn all_reduce(
        &mut self,
        comm: &Comm,
        input: Option<&'a [u8]>,
        output: &'a mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<&mut Self> {
        let op = op_of(OpKind::AllReduce, input, output, dtype, op, 1, 1)?;
        self.push(comm, op)
    }

    pub fn broadcast(
        &mut self,
        comm: &Comm,
        input: Option<&'a [u8]>,
        output: &'a mut [u8],
        dtype: DataType,
        root: usize,
    ) -> Result<&mut Self> {
        let op = op_of(
            OpKind::Broadcast { root },
            input,
            output,
            dtype,
            RedOp::Sum,
            1,
            1,
        )?;
        self.push(comm, op)
    }

    /// Runs every operation; the first error is returned.
    pub fn run(self) -> Result<()> {
        let group_api = self.api.ending();
        run_tasks(self.tasks, group_api)
    }
}

fn check_whole(len: usize, dtype: DataType) -> Result<()> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::InvalidArgument(format!(
            "a buffer of {len} bytes is not a whole number of {}",
            dtype.name()
        )));
    }
    Ok(())
}

/// All-to-all as grouped sends and receives: block `i` of `input` goes to
/// rank `i`, block `j` of `output` comes from rank `j`.
pub fn all_to_all(comm: &Comm, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
    let n = comm.count();
    if input.len() != output.len() || !input.len().is_multiple_of(n * dtype.size()) {
        return Err(Error::InvalidArgument(format!(
            "all_to_all: sendbuff ({} bytes) and recvbuff ({} bytes) must be equal and hold {n} blocks of {}",
            input.len(),
            output.len(),
            dtype.name()
        )));
    }
    let block = input.len() / n;
    let mut g = Group::new();
    for (peer, (i, o)) in input
        .chunks(block.max(1))
        .zip(output.chunks_mut(block.max(1)))
        .enumerate()
        .take(n)
    {
        g.send(comm, i, dtype, peer)?;
        g.recv(comm, o, dtype, peer)?;
    }
    g.run()
}

/// Gather to `root` as grouped sends and receives (`output` only at the root).
pub fn gather(
    comm: &Comm,
    input: &[u8],
    output: Option<&mut [u8]>,
    dtype: DataType,
    root: usize,
) -> Result<()> {
    let n = comm.count();
    let mut g = Group::new();
    g.send(comm, input, dtype, root)?;
    if comm.user_rank() == root {
        let out = output
            .ok_or_else(|| Error::InvalidArgument("gather: the root needs a recvbuff".into()))?;
        if out.len() != input.len() * n {
            return Err(Error::InvalidArgument(format!(
                "gather: recvbuff has {} bytes, expected {}",
                out.len(),
                input.len() * n
            )));
        }
        for (peer, o) in out.chunks_mut(input.len().max(1)).enumerate().take(n) {
            g.recv(comm, o, dtype, peer)?;
        }
    }
    g.run()
}

/// Scatter from `root` as grouped sends and receives (`input` only at the root).
pub fn scatter(
    comm: &Comm,
    input: Option<&[u8]>,
    output: &mut [u8],
    dtype: DataType,
    root: usize,
) -> Result<()> {
    let n = comm.count();
    let mut g = Group::new();
    if comm.user_rank() == root {
        let inp = input
            .ok_or_else(|| Error::InvalidArgument("scatter: the root needs a sendbuff".into()))?;
        if inp.len() != output.len() * n {
            return Err(Error::InvalidArgument(format!(
                "scatter: sendbuff has {} bytes, expected {}",
                inp.len(),
                output.len() * n
            )));
        }
        for (peer, i) in inp.chunks(output.len().max(1)).enumerate().take(n) {
            g.send(comm, i, dtype, peer)?;
        }
    }
    g.recv(comm, output, dtype, root)?;
    g.run()
}

/// The calls of one communicator: each a group of its own (a lone call on
/// borrowed slices, or a raw operation queued in the thread's group).
impl Comm {
    /// Queues an operation on buffers given by address: at once, or at the
    /// end of the thread's current group (NCCL's calls inside
    /// `ncclGroupStart`/`ncclGroupEnd`).
    ///
    /// # Safety
    /// The buffers must be valid for the sizes NCCL defines for the
    /// operation and not be accessed by anyone else until it completes (for
    /// host memory: until the call, or the enclosing `group_end`, returns).
    #[allow(unsafe_code)]
    pub unsafe fn enqueue(&self, op: Op) -> Result<()> {
        let core = self.core()?;
        let bufs = op.validate(self.user_rank(), self.count())?;
        if core.device.is_none() {
            check_host_side(&op, &bufs)?;
        }
        submit(self.clone(), core, op, bufs)
    }

    /// Runs one operation now on borrowed buffers.
    fn run(&self, op: Op) -> Result<()> {
        if depth() > 0 {
            return Err(Error::InvalidUsage(format!(
                "{} on borrowed slices cannot join a group started with group_start(): use Group to batch safe calls, or the raw enqueue",
                op.kind.name()
            )));
        }
        let mut g = Group::lone();
        g.push(self, op)?;
        g.run()
    }

    /// All-reduce; `input: None` reduces `output` in place.
    pub fn all_reduce(
        &self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        self.run(op_of(OpKind::AllReduce, input, output, dtype, op, 1, 1)?)
    }

    /// Broadcast from `root`; only the root's input is read (`None`: in place).
    pub fn broadcast(
        &self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.run(op_of(
            OpKind::Broadcast { root },
            input,
            output,
            dtype,
            RedOp::Sum,
            1,
            1,
        )?)
    }

    /// Reduce to `root`; only the root's output is written.
    pub fn reduce(
        &self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.run(op_of(
            OpKind::Reduce { root },
            input,
            output,
            dtype,
            op,
            1,
            1,
        )?)
    }

    /// All-gather: `output` holds `count()` blocks of `input`'s size;
    /// `None` gathers in place from this rank's block of `output`.
    pub fn all_gather(
        &self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: DataType,
    ) -> Result<()> {
        let n = self.count();
        let mut op = op_of(OpKind::AllGather, input, output, dtype, RedOp::Sum, 1, n)?;
        if input.is_none() {
            op.input = op
                .output
                .wrapping_add(self.user_rank() * op.count * dtype.size());
        }
        self.run(op)
    }

    /// Reduce-scatter in place: `buf` holds `count()` blocks; this rank's
    /// block receives the result (NCCL's in-place rule:
    /// recvbuff = sendbuff + rank * recvcount).
    pub fn reduce_scatter_in_place(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let n = self.count();
        let mut op = op_of(OpKind::ReduceScatter, None, buf, dtype, op, 1, n)?;
        op.output = op
            .output
            .wrapping_add(self.user_rank() * op.count * dtype.size());
        self.run(op)
    }

    /// Reduce-scatter: `input` holds `count()` blocks of `output`'s size.
    pub fn reduce_scatter(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let n = self.count();
        self.run(op_of(
            OpKind::ReduceScatter,
            Some(input),
            output,
            dtype,
            op,
            n,
            1,
        )?)
    }

    pub fn send(&self, input: &[u8], dtype: DataType, peer: usize) -> Result<()> {
        let mut g = Group::lone();
        g.send(self, input, dtype, peer)?;
        g.run()
    }

    pub fn recv(&self, output: &mut [u8], dtype: DataType, peer: usize) -> Result<()> {
        let mut g = Group::lone();
        g.recv(self, output, dtype, peer)?;
        g.run()
    }
}

/// A host-memory communicator's executor reads and writes its buffers with
/// the CPU: device memory there would be a segfault, so it is refused
/// naming the argument (NCCL never meets this: it has no host path).
fn check_host_side(op: &Op, bufs: &crate::mem::OpBuffers) -> Result<()> {
    if op.count == 0 {
        return Ok(());
    }
    for (what, ptr, bytes) in bufs.used() {
        if crate::cuda::pointer_kind(ptr) == crate::cuda::PtrKind::Device {
            return Err(Error::InvalidArgument(format!(
                "{}: {what} {ptr:#x} is GPU memory, but this communicator runs on host memory (it was created with no GPU, or with OXCCL_HOST_MEMORY=1): pass host memory, or create the communicator on that GPU",
                op.kind.name()
            )));
        }
        check_extent(op, what, ptr, bytes, false)?;
    }
    Ok(())
}

/// Builds an operation from slices, deriving the count from the output
/// (divided by `out_blocks`) and checking the input's size (`in_blocks` per count).
fn op_of(
    kind: OpKind,
    input: Option<&[u8]>,
    output: &mut [u8],
    dtype: DataType,
    redop: RedOp,
    in_blocks: usize,
    out_blocks: usize,
) -> Result<Op> {
    let es = dtype.size();
    if !output.len().is_multiple_of(es * out_blocks) {
        return Err(Error::InvalidArgument(format!(
            "{}: recvbuff of {} bytes is not a whole number of {} blocks of {}",
            kind.name(),
            output.len(),
            out_blocks,
            dtype.name()
        )));
    }
    let count = output.len() / es / out_blocks;
    if let Some(i) = input {
        if i.len() != count * es * in_blocks {
            return Err(Error::InvalidArgument(format!(
                "{}: sendbuff has {} bytes, expected {} ({} x {} element(s) of {})",
                kind.name(),
                i.len(),
                count * es * in_blocks,
                in_blocks,
                count,
                dtype.name()
            )));
        }
    }
    let output_ptr = output.as_mut_ptr();
    Ok(Op {
        kind,
        input: input.map_or(output_ptr as *const u8, |i| i.as_ptr()),
        output: output_ptr,
        count,
        dtype,
        redop,
        stream: 0,
        user_tag: 0,
        call: Default::default(),
    })
}
