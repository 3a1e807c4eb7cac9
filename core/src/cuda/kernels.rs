//! oxccl's kernels on one GPU: compiled from `oxccl-kernels` once per
//! (architecture, datatype) in the process and on disk, loaded once per
//! context, launched through typed handles.
//!
//! A datatype's kernels are compiled on its first use, so a job that only
//! ever reduces bf16 never pays for the other eleven types. Each op of the
//! type is its own NVRTC program and the programs compile side by side:
//! one program for all six ops took 17-19 s on a fresh H200 host before
//! its first collective could start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use oxccl_kernels::{KernelOp, COPY_KERNEL, ELEM_TYPES, SOURCE, SOURCE_HASH};
use tracing::info;

use super::abi::{CollArgs, CopyArgs, FillArgs, ReduceArgs, Scalars, LOCAL_MAX};
use super::cache;
use super::context::Context;
use super::module::{Kernel, Module};
use super::nvrtc::{self, Compiled};
use super::stream::RawStream;
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};

/// Compiler options; part of the cache key. Contraction into FMA is off so
/// that a pre-multiplied sum rounds twice, as on the host.
const OPTIONS: &[&str] = &["--std=c++17", "--fmad=false"];

/// Threads per block of the single-GPU kernels.
const LOCAL_THREADS: u32 = 512;

/// The kernel op and its scalars for `op` on `dtype` among `nranks` ranks:
/// the float average is a pre-multiplied sum by 1/n, the integer average a
/// sum divided at the end (as NCCL, and core/src/reduce.rs).
pub fn kernel_op(dtype: DataType, op: RedOp, nranks: usize) -> (KernelOp, Scalars) {
    let scaled = |s: f64| Scalars {
        f64: s,
        int: int_scalar(dtype, s),
        div: 1,
        f32: s as f32,
        pad: 0,
    };
    let plain = Scalars {
        div: 1,
        ..Scalars::default()
    };
    match op {
        RedOp::Sum => (KernelOp::Sum, plain),
        RedOp::Prod => (KernelOp::Prod, plain),
        RedOp::Max => (KernelOp::Max, plain),
        RedOp::Min => (KernelOp::Min, plain),
        RedOp::PreMulSum(s) => (KernelOp::PreMulSum, scaled(s)),
        RedOp::Avg if dtype.is_float() => (KernelOp::PreMulSum, scaled(1.0 / nranks as f64)),
        RedOp::Avg => (
            KernelOp::SumPostDiv,
            Scalars {
                div: nranks.max(1) as u64,
                ..plain
            },
        ),
    }
}

/// The scalar in the integer type, as Rust's `as` converts (saturating),
/// which is what the host reduction multiplies by.
fn int_scalar(dtype: DataType, s: f64) -> u64 {
    match dtype {
        DataType::Int8 => s as i8 as i64 as u64,
        DataType::Uint8 => s as u8 as u64,
        DataType::Int32 => s as i32 as i64 as u64,
        DataType::Uint32 => s as u32 as u64,
        DataType::Int64 => s as i64 as u64,
        DataType::Uint64 => s as u64,
        _ => 0,
    }
}

/// The ops compiled for a type: the integer average exists for integers only.
fn ops_of(dtype: DataType) -> impl Iterator<Item = KernelOp> {
    KernelOp::ALL
        .into_iter()
        .filter(move |o| !(dtype.is_float() && *o == KernelOp::SumPostDiv))
}

fn elem_name(dtype: DataType) -> &'static str {
    ELEM_TYPES[dtype as usize].0
}

/// What a compilation unit instantiates: one op of a datatype (its
/// collective and reduce kernels), a datatype's fill, or only the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    Copy,
    Op(DataType, KernelOp),
    Fill(DataType),
}

impl Unit {
    fn names(self) -> Vec<String> {
        match self {
            Unit::Copy => Vec::new(),
            Unit::Op(d, o) => vec![
                oxccl_kernels::coll_kernel(elem_name(d), o),
                oxccl_kernels::reduce_kernel(elem_name(d), o),
            ],
            Unit::Fill(d) => vec![oxccl_kernels::fill_kernel(elem_name(d))],
        }
    }

    fn tag(self) -> String {
        match self {
            Unit::Copy => "copy".into(),
            Unit::Op(d, o) => format!("{}-{}", d.name(), o.type_name()),
            Unit::Fill(d) => format!("{}-fill", d.name()),
        }
    }
}

/// Every unit of a datatype: one per op, and its fill.
fn units_of(dtype: DataType) -> Vec<Unit> {
    ops_of(dtype)
        .map(|o| Unit::Op(dtype, o))
        .chain([Unit::Fill(dtype)])
        .collect()
}

/// Compiles (or loads) `units` side by side, as many at once as the host
/// has threads: NVRTC compiles independent programs concurrently, and a
/// datatype's first use then waits for its slowest op, not for their sum.
fn compiled_all(arch: (i32, i32), units: &[Unit]) -> Result<Vec<Arc<Compiled>>> {
    let width = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = Vec::with_capacity(units.len());
    for chunk in units.chunks(width.max(1)) {
        let done: Vec<Result<Arc<Compiled>>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&u| s.spawn(move || compiled(arch, u)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Internal(
                            "a kernel compilation thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        for c in done {
            out.push(c?);
        }
    }
    Ok(out)
}

fn key(arch: (i32, i32), nvrtc: (i32, i32), unit: Unit) -> String {
    let opts = oxccl_kernels::fnv1a64(OPTIONS.join(" ").as_bytes());
    format!(
        "{SOURCE_HASH:016x}-{:08x}-sm{}{}-nvrtc{}.{}-{}",
        opts as u32,
        arch.0,
        arch.1,
        nvrtc.0,
        nvrtc.1,
        unit.tag()
    )
}

type Cell = Arc<OnceLock<Result<Arc<Compiled>>>>;
type Registry = Mutex<HashMap<((i32, i32), Unit), Cell>>;

/// Compiles a unit once per process (ranks that are threads share it),
/// from the disk cache when it is there.
fn compiled(arch: (i32, i32), unit: Unit) -> Result<Arc<Compiled>> {
    static UNITS: OnceLock<Registry> = OnceLock::new();
    let cell = UNITS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Internal("kernel registry lock poisoned".into()))?
        .entry((arch, unit))
        .or_default()
        .clone();
    cell.get_or_init(|| {
        let nv = nvrtc::version()?;
        let key = key(arch, nv, unit);
        let names = unit.names();
        if let Some(c) = cache::load(&key) {
            if names.iter().all(|n| c.symbol(n).is_some()) {
                info!(target: "oxccl::init", "kernels ({}) for sm_{}{}: loaded from the cache {}", unit.tag(), arch.0, arch.1,
                    cache::path(&key).map(|p| p.display().to_string()).unwrap_or_default());
                return Ok(Arc::new(c));
            }
        }
        let t = Instant::now();
        let c = nvrtc::compile(SOURCE, "oxccl_kernels.cu", arch, &names, OPTIONS)?;
        let stored = cache::store(&key, &c);
        info!(target: "oxccl::init", "kernels ({}) for sm_{}{}: compiled with NVRTC {}.{} in {} ms; {}", unit.tag(), arch.0, arch.1, nv.0, nv.1,
            t.elapsed().as_millis(),
            match stored { Some(p) => format!("cached at {}", p.display()), None => "not cached".into() });
        Ok(Arc::new(c))
    })
    .clone()
}

/// Compiles the kernels of `dtypes` (and the copy) for `arch` into the
/// process and the disk cache. Needs NVRTC only, no GPU: a cache can be
/// warmed before a job starts, or on a build machine.
pub fn precompile(arch: (i32, i32), dtypes: &[DataType]) -> Result<()> {
    let units: Vec<Unit> = [Unit::Copy]
        .into_iter()
        .chain(dtypes.iter().flat_map(|d| units_of(*d)))
        .collect();
    compiled_all(arch, &units).map(|_| ())
}

/// Element i is `((i * 2654435761 + seed) mod modulus) + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillPattern {
    pub seed: u64,
    pub modulus: u64,
    pub offset: i64,
}

impl FillPattern {
    /// Element `i` as the kernel computes it, before rounding to the type.
    pub fn value(&self, i: usize) -> i64 {
        let v = (i as u64)
            .wrapping_mul(2_654_435_761)
            .wrapping_add(self.seed)
            % self.modulus;
        v as i64 + self.offset
    }
}

/// One datatype's kernels, loaded in one context.
struct DtypeKernels {
    coll: HashMap<KernelOp, Kernel<CollArgs>>,
    reduce: HashMap<KernelOp, Kernel<ReduceArgs>>,
    fill: Kernel<FillArgs>,
}

/// The kernels of one GPU context, loaded on first use.
pub struct KernelSet {
    ctx: Arc<Context>,
    arch: (i32, i32),
    sms: usize,
    dtypes: Mutex<HashMap<DataType, Arc<DtypeKernels>>>,
    copy: OnceLock<Result<Kernel<CopyArgs>>>,
}

impl KernelSet {
    /// The GPU's compute capability, which the kernels are built for.
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }

    pub fn new(ctx: &Arc<Context>) -> Result<KernelSet> {
        let dev = ctx.device();
        Ok(KernelSet {
            ctx: ctx.clone(),
            arch: dev.compute_capability()?,
            sms: dev.multiprocessors()?,
            dtypes: Mutex::new(HashMap::new()),
            copy: OnceLock::new(),
        })
    }

    /// The kernel set of `ctx`'s device, shared by every user in this
    /// process. Loading a module waits for the kernels running in the
    /// context, so ranks that share a GPU (and so its primary context)
    /// must not load their own: a rank's first launch would wait for a
    /// peer's kernel that waits for that launch.
    pub fn shared(ctx: &Arc<Context>) -> Result<Arc<KernelSet>> {
        static SETS: Mutex<Vec<(usize, std::sync::Weak<KernelSet>)>> = Mutex::new(Vec::new());
        let dev = ctx.device().ordinal();
        let mut sets = SETS
            .lock()
            .map_err(|_| Error::Internal("kernel registry lock poisoned".into()))?;
        sets.retain(|(_, w)| w.strong_count() > 0);
        let found = sets
            .iter()
            .find(|(d, _)| *d == dev)
            .and_then(|(_, w)| w.upgrade())
            .filter(|k| k.ctx.same(ctx));
        if let Some(k) = found {
            return Ok(k);
        }
        let k = Arc::new(KernelSet::new(ctx)?);
        sets.push((dev, Arc::downgrade(&k)));
        Ok(k)
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn multiprocessors(&self) -> usize {
        self.sms
    }

    fn dtype(&self, dtype: DataType) -> Result<Arc<DtypeKernels>> {
        let mut map = self
            .dtypes
            .lock()
            .map_err(|_| Error::Internal("kernel set lock poisoned".into()))?;
        if let Some(k) = map.get(&dtype) {
            return Ok(k.clone());
        }
        let units = units_of(dtype);
        let compiled = compiled_all(self.arch, &units)?;
        let e = elem_name(dtype);
        let mut coll = HashMap::new();
        let mut reduce = HashMap::new();
        let mut fill = None;
        // Every module of the type is loaded now, before its first launch
        // (a load waits for the context's running kernels).
        for (unit, c) in units.iter().zip(&compiled) {
            let module = Module::load(&self.ctx, &c.cubin)?;
            let sym = |expr: String| -> Result<String> {
                c.symbol(&expr)
                    .map(str::to_string)
                    .ok_or_else(|| Error::Internal(format!("no symbol for {expr}")))
            };
            match *unit {
                Unit::Op(_, op) => {
                    // SAFETY: oxccl_coll<T, Op> takes one CollArgs and
                    // oxccl_reduce<T, Op> one ReduceArgs (coll.cu, local.cu).
                    coll.insert(op, unsafe {
                        Kernel::new(&module, &sym(oxccl_kernels::coll_kernel(e, op))?)?
                    });
                    // SAFETY: as above.
                    reduce.insert(op, unsafe {
                        Kernel::new(&module, &sym(oxccl_kernels::reduce_kernel(e, op))?)?
                    });
                }
                Unit::Fill(_) => {
                    // SAFETY: oxccl_fill<T> takes one FillArgs (local.cu).
                    fill = Some(unsafe {
                        Kernel::new(&module, &sym(oxccl_kernels::fill_kernel(e))?)?
                    });
                }
                Unit::Copy => {}
            }
        }
        let fill =
            fill.ok_or_else(|| Error::Internal(format!("no fill unit for {}", dtype.name())))?;
        let k = Arc::new(DtypeKernels { coll, reduce, fill });
        map.insert(dtype, k.clone());
        Ok(k)
    }

    /// Blocks a local launch may take: the caller's budget, and never more
    /// than two per multiprocessor.
    fn cap(&self, max_blocks: usize) -> usize {
        max_blocks.clamp(1, self.sms * 2)
    }

    /// Compiles (or loads) a datatype's kernels now rather than on first use.
    pub fn prepare(&self, dtype: DataType) -> Result<()> {
        self.dtype(dtype).map(|_| ())
    }

    /// The collective kernel for a datatype and op.
    pub fn coll(&self, dtype: DataType, op: KernelOp) -> Result<Kernel<CollArgs>> {
        self.dtype(dtype)?
            .coll
            .get(&op)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no {op:?} kernel for {}", dtype.name())))
    }

    fn copy_kernel(&self) -> Result<Kernel<CopyArgs>> {
        self.copy
            .get_or_init(|| {
                let c = compiled(self.arch, Unit::Copy)?;
                let m = Module::load(&self.ctx, &c.cubin)?;
                // SAFETY: oxccl_copy takes one CopyArgs (local.cu).
                unsafe { Kernel::new(&m, COPY_KERNEL) }
            })
            .clone()
    }

    /// Loads the copy kernel now rather than on first use (a load waits
    /// for the context's queued work).
    pub fn prepare_copy(&self) -> Result<()> {
        self.copy_kernel().map(|_| ())
    }

    /// Copies `bytes` from `src` to `dst` (device addresses) on `stream`,
    /// on at most `max_blocks` blocks (the communicator's CTA budget).
    pub fn copy(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        max_blocks: usize,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let k = self.copy_kernel()?;
        let per_block = LOCAL_THREADS as usize * 16 * 4;
        let grid = bytes.div_ceil(per_block).clamp(1, self.cap(max_blocks)) as u32;
        k.launch(
            grid,
            LOCAL_THREADS,
            stream,
            &CopyArgs {
                dst,
                src,
                bytes: bytes as u64,
            },
        )
    }

    /// Writes the pattern's element i, rounded to `dtype`, on `stream`:
    /// inputs the host can recompute, written at memory speed.
    pub fn fill(
        &self,
        dst: u64,
        count: usize,
        dtype: DataType,
        pattern: FillPattern,
        stream: RawStream,
    ) -> Result<()> {
        let FillPattern {
            seed,
            modulus,
            offset,
        } = pattern;
        if count == 0 {
            return Ok(());
        }
        if modulus == 0 {
            return Err(Error::InvalidArgument("fill: modulus 0".into()));
        }
        let k = self.dtype(dtype)?.fill.clone();
        let grid = count
            .div_ceil(LOCAL_THREADS as usize)
            .clamp(1, self.sms * 4) as u32;
        k.launch(
            grid,
            LOCAL_THREADS,
            stream,
            &FillArgs {
                dst,
                count: count as u64,
                seed,
                modulus,
                offset,
            },
        )
    }

    /// Every one of `outputs` = `post(pre_a(inputs[0]) op pre_b(inputs[1])
    /// op ...)` element-wise on `stream`, in one launch; which of the op's
    /// pre and post steps apply is given by `flags` (`abi::F_*`, `F_PRE_B`
    /// for every input after the first); `nranks` sets the average's
    /// divisor or scale. One input: a copy to every output. An output may
    /// be an input only if no later input is an output. At most
    /// `max_blocks` blocks (the communicator's CTA budget).
    #[allow(clippy::too_many_arguments)] // NCCL-shaped: buffers, count, type, op, stream
    pub fn reduce(
        &self,
        outputs: &[u64],
        inputs: &[u64],
        count: usize,
        dtype: DataType,
        op: RedOp,
        nranks: usize,
        flags: u32,
        max_blocks: usize,
        stream: RawStream,
    ) -> Result<()> {
        if count == 0 || outputs.is_empty() {
            return Ok(());
        }
        if inputs.is_empty() || inputs.len() > LOCAL_MAX || outputs.len() > LOCAL_MAX {
            return Err(Error::Internal(format!(
                "a local reduce of {} inputs into {} outputs (1 to {LOCAL_MAX} each)",
                inputs.len(),
                outputs.len()
            )));
        }
        let (kop, sc) = kernel_op(dtype, op, nranks);
        let k = self
            .dtype(dtype)?
            .reduce
            .get(&kop)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no {kop:?} reduce kernel")))?;
        let per_block = LOCAL_THREADS as usize * 16 * 4 / dtype.size();
        let grid = count.div_ceil(per_block).clamp(1, self.cap(max_blocks)) as u32;
        let mut args = ReduceArgs {
            inputs: [0; LOCAL_MAX],
            outputs: [0; LOCAL_MAX],
            count: count as u64,
            sc,
            flags,
            nin: inputs.len() as u32,
            nout: outputs.len() as u32,
            pad: 0,
        };
        args.inputs[..inputs.len()].copy_from_slice(inputs);
        args.outputs[..outputs.len()].copy_from_slice(outputs);
        k.launch(grid, LOCAL_THREADS, stream, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_follow_the_host_conversions() {
        let (k, s) = kernel_op(DataType::Float16, RedOp::Avg, 4);
        assert_eq!(k, KernelOp::PreMulSum);
        assert_eq!(s.f32, 0.25);
        let (k, s) = kernel_op(DataType::Int32, RedOp::Avg, 3);
        assert_eq!((k, s.div), (KernelOp::SumPostDiv, 3));
        let (_, s) = kernel_op(DataType::Int8, RedOp::PreMulSum(-2.7), 2);
        assert_eq!(s.int as i64, -2);
        let (_, s) = kernel_op(DataType::Uint8, RedOp::PreMulSum(300.0), 2);
        assert_eq!(s.int, 255);
    }

    #[test]
    fn units_name_every_op_of_their_type() {
        let names = |d| units_of(d).iter().map(|u| u.names().len()).sum::<usize>();
        assert_eq!(names(DataType::Float32), 5 * 2 + 1);
        assert_eq!(names(DataType::Int32), 6 * 2 + 1);
        assert!(
            key((9, 0), (13, 0), Unit::Op(DataType::Bfloat16, KernelOp::Sum))
                .ends_with("sm90-nvrtc13.0-bfloat16-OpSum")
        );
        assert!(key((9, 0), (13, 0), Unit::Fill(DataType::Bfloat16))
            .ends_with("sm90-nvrtc13.0-bfloat16-fill"));
    }
}
