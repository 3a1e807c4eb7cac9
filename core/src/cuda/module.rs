//! Loaded device code and typed kernel launches.

use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use super::stream::RawStream;
use crate::error::{Error, Result};

/// A cubin loaded into a context; unloaded when the last kernel goes.
#[derive(Debug)]
pub struct Module {
    ctx: Arc<Context>,
    raw: sys::CUmodule,
}

// SAFETY: module handles may be used from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: as for Send; loading functions does not mutate the module.
unsafe impl Sync for Module {}

impl Module {
    pub fn load(ctx: &Arc<Context>, cubin: &[u8]) -> Result<Arc<Module>> {
        ctx.bind()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: `raw` is a valid out-pointer; the image is a live byte
            // slice (cubin is self-describing: an ELF image with its size).
            unsafe { sys::cuModuleLoadData(&mut raw, cubin.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        Ok(Arc::new(Module {
            ctx: ctx.clone(),
            raw,
        }))
    }

    fn function(self: &Arc<Self>, symbol: &str) -> Result<sys::CUfunction> {
        let name = CString::new(symbol)
            .map_err(|_| Error::Internal(format!("kernel name {symbol:?} has a NUL")))?;
        self.ctx.bind()?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        check(
            // SAFETY: `f` is a valid out-pointer; the module is loaded; the name
            // is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut f, self.raw, name.as_ptr()) },
            format!("cuModuleGetFunction({symbol})"),
        )?;
        // Under lazy loading (CUDA_MODULE_LOADING=LAZY, the default since
        // CUDA 12.2) the function would be loaded at its first launch, which
        // waits for the context's queued work: with a stream of this context
        // blocked on a word only that launch's work stores (ranks of one
        // process on one GPU), it never returns. Asking an attribute loads
        // it now.
        let mut regs = 0;
        check(
            // SAFETY: a valid out-pointer and a function just returned.
            unsafe {
                sys::cuFuncGetAttribute(
                    &mut regs,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                    f,
                )
            },
            format!("cuFuncGetAttribute({symbol})"),
        )?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by cuModuleLoadData, unloaded once.
            let _ = unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

/// Arguments passed to a kernel as its single by-value parameter.
///
/// # Safety
/// The type must be `#[repr(C)]` with the layout of the parameter of every
/// kernel it is launched with, and hold no host pointers the kernel would use.
pub unsafe trait KernelArg: Copy {}

/// A kernel whose one parameter is an `A`.
#[derive(Debug)]
pub struct Kernel<A: KernelArg> {
    module: Arc<Module>,
    raw: sys::CUfunction,
    _arg: PhantomData<fn(A)>,
}

impl<A: KernelArg> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        Kernel {
            module: self.module.clone(),
            raw: self.raw,
            _arg: PhantomData,
        }
    }
}

// SAFETY: a function handle stays valid while its module (held here) is
// loaded, and may be launched from any thread.
unsafe impl<A: KernelArg> Send for Kernel<A> {}
// SAFETY: as for Send.
unsafe impl<A: KernelArg> Sync for Kernel<A> {}

impl<A: KernelArg> Kernel<A> {
    /// # Safety
    /// The kernel `symbol` of `module` must take exactly one parameter of type `A`.
    pub(crate) unsafe fn new(module: &Arc<Module>, symbol: &str) -> Result<Kernel<A>> {
        Ok(Kernel {
            module: module.clone(),
            raw: module.function(symbol)?,
            _arg: PhantomData,
        })
    }

    /// [`Kernel::launch`] in thread-block clusters of `cluster` blocks
    /// (compute capability 9.0 and later), spread over the GPU's GPCs as
    /// NCCL launches its kernels: a cluster runs within one GPC. A `grid`
    /// that `cluster` does not divide runs in clusters of one, as in NCCL;
    /// 0 or 1: a plain launch.
    pub fn launch_in_clusters(
        &self,
        grid: u32,
        block: u32,
        cluster: u32,
        stream: RawStream,
        arg: &A,
    ) -> Result<()> {
        if cluster <= 1 {
            return self.launch(grid, block, stream, arg);
        }
        self.module.ctx.bind()?;
        let dim = if grid.is_multiple_of(cluster) {
            cluster
        } else {
            1
        };
        // SAFETY: an all-zero launch attribute is a valid value of the C
        // struct (an id and a union of plain data); both are set below.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        attrs[0].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[0].value.clusterDim =
            sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: dim, y: 1, z: 1 };
        attrs[1].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
        attrs[1].value.clusterSchedulingPolicyPreference =
            sys::CUclusterSchedulingPolicy::CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.sys(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        let mut params = [arg as *const A as *mut c_void];
        check(
            // SAFETY: as in `launch`; `config` and its attributes outlive
            // the call, which copies them.
            unsafe {
                sys::cuLaunchKernelEx(&config, self.raw, params.as_mut_ptr(), std::ptr::null_mut())
            },
            "cuLaunchKernelEx",
        )
    }

    /// Enqueues `grid` blocks of `block` threads on `stream`; returns at once.
    pub fn launch(&self, grid: u32, block: u32, stream: RawStream, arg: &A) -> Result<()> {
        self.module.ctx.bind()?;
        let mut params = [arg as *const A as *mut c_void];
        check(
            // SAFETY: the kernel takes one `A` (contract of `new`); the driver
            // copies the parameter before returning; the stream is valid by its
            // contract; the module is loaded.
            unsafe {
                sys::cuLaunchKernel(
                    self.raw,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.sys(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}
