//! The driver library and the GPUs it sees.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::check::check;
use crate::error::{Error, Result};

/// Every driver entry point this module calls, by the name cudarc loads.
/// cudarc panics on a missing symbol, so they are all looked up once here
/// and a driver too old for one is an error naming it.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuPointerGetAttribute",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemsetD8Async",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamWriteValue32_v2",
    "cuStreamWaitValue32_v2",
    "cuMemcpyDtoH_v2",
    "cuIpcGetMemHandle",
    "cuMemGetAddressRange_v2",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuStreamGetCaptureInfo_v3",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
];

/// Loads and initialises the driver once; every later call gets the same
/// answer. Missing library, missing symbol, no GPU: an error.
pub fn driver() -> Result<()> {
    static DRIVER: OnceLock<Result<()>> = OnceLock::new();
    DRIVER.get_or_init(load_driver).clone()
}

fn load_driver() -> Result<()> {
    // SAFETY: only tries to open the library by its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::System(
            "CUDA driver library (libcuda.so) not found: no NVIDIA driver on this machine?".into(),
        ));
    }
    // SAFETY: `culib` opens the library, which was just found; `get` only
    // looks a name up.
    let missing: Vec<&str> = SYMBOLS
        .iter()
        .copied()
        .filter(|s| unsafe { sys::culib().get::<*const ()>(s.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(Error::System(format!(
            "the CUDA driver lacks {}: driver too old",
            missing.join(", ")
        )));
    }
    // A panic inside cudarc's loader is the last failure left; keep it an error.
    // SAFETY: cuInit takes no pointers.
    let r = std::panic::catch_unwind(|| unsafe { sys::cuInit(0) })
        .map_err(|_| Error::System("loading the CUDA driver panicked".into()))?;
    check(r, "cuInit")
}

/// How many GPUs the driver sees (0 is an answer, not an error, once the
/// driver loaded; cuInit fails with no device at all).
pub fn device_count() -> Result<usize> {
    driver()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// The driver's version as (major, minor).
pub fn driver_version() -> Result<(i32, i32)> {
    driver()?;
    let mut v: c_int = 0;
    check(
        // SAFETY: `v` is a valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// A GPU by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    ordinal: usize,
    raw: sys::CUdevice,
}

impl Device {
    pub fn get(ordinal: usize) -> Result<Device> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} does not exist: the driver sees {count}"
            )));
        }
        let mut raw: sys::CUdevice = 0;
        check(
            // SAFETY: `raw` is a valid out-pointer; the ordinal is in range.
            unsafe { sys::cuDeviceGet(&mut raw, ordinal as c_int) },
            "cuDeviceGet",
        )?;
        Ok(Device { ordinal, raw })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn raw(&self) -> sys::CUdevice {
        self.raw
    }

    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        check(
            // SAFETY: the buffer holds `len` bytes and the driver terminates it.
            unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, self.raw) },
            "cuDeviceGetName",
        )?;
        // SAFETY: terminated by the driver within the buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub(super) fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        let mut v: c_int = 0;
        check(
            // SAFETY: `v` is a valid out-pointer.
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, self.raw) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    /// (major, minor): (9, 0) on H100 and H200.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        use sys::CUdevice_attribute as A;
        Ok((
            self.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Blocks of `threads` threads that are resident on this GPU at once,
    /// at most, for a kernel using up to 64 registers a thread (what
    /// `__launch_bounds__(1024, 1)` allows the collective kernel): kernels
    /// whose blocks wait for each other must all fit.
    pub fn resident_blocks(&self, threads: u32) -> Result<usize> {
        use sys::CUdevice_attribute as A;
        let threads = threads.max(1) as i64;
        let per_sm_threads =
            i64::from(self.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?);
        let regs =
            i64::from(self.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?);
        let per_sm = (per_sm_threads / threads).min(regs / (threads * 64)).max(1);
        Ok(self.multiprocessors()? * per_sm as usize)
    }

    /// Whether the driver can export this GPU's memory as a dma-buf
    /// (NCCL's dmaBufSupported): a driver of CUDA 11.7 or later with
    /// `cuMemGetHandleForAddressRange`, and the GPU's
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub fn dma_buf_supported(&self) -> bool {
        if !driver_version().is_ok_and(|v| v >= (11, 7)) {
            return false;
        }
        // SAFETY: the library is loaded (driver_version succeeded); `get`
        // only looks a name up.
        let found =
            unsafe { sys::culib().get::<*const ()>(b"cuMemGetHandleForAddressRange") }.is_ok();
        found
            && self
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
                .is_ok_and(|v| v == 1)
    }

    pub fn multiprocessors(&self) -> Result<usize> {
        let v =
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(v.max(0) as usize)
    }

    /// Whether kernels on this GPU can address `peer`'s memory.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if peer.raw == self.raw {
            return Ok(true);
        }
        let mut v: c_int = 0;
        check(
            // SAFETY: `v` is a valid out-pointer; both devices are valid.
            unsafe { sys::cuDeviceCanAccessPeer(&mut v, self.raw, peer.raw) },
            "cuDeviceCanAccessPeer",
        )?;
        Ok(v != 0)
    }

    /// The PCI address as the driver spells it (`0000:1B:00.0`).
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as c_char; 32];
        check(
            // SAFETY: the buffer holds `len` bytes and the driver terminates it.
            unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, self.raw) },
            "cuDeviceGetPCIBusId",
        )?;
        // SAFETY: terminated by the driver within the buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// What the driver says of this GPU's access to `peer`'s memory.
    pub fn p2p(&self, peer: &Device) -> Result<P2p> {
        use sys::CUdevice_P2PAttribute as A;
        let get = |a: A| -> Result<i32> {
            let mut v: c_int = 0;
            check(
                // SAFETY: `v` is a valid out-pointer; both devices are valid.
                unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, self.raw, peer.raw) },
                "cuDeviceGetP2PAttribute",
            )?;
            Ok(v)
        };
        Ok(P2p {
            access: get(A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            atomics: get(A::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            performance_rank: get(A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        })
    }
}

/// Peer access between two GPUs as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2p {
    pub access: bool,
    /// Atomics on the peer's memory run natively (NVLink), not emulated.
    pub atomics: bool,
    /// The driver's relative performance value of this pair's link, only
    /// comparable with other pairs of the same machine.
    pub performance_rank: i32,
}
