//! The few NVML calls that tell which NVLinks are up and what is at their
//! far end. cudarc 0.19 has no NVML, so `libnvidia-ml.so.1` (installed with
//! the driver) is opened here at run time; this file is the only unsafe
//! code of the topology.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Mutex, MutexGuard, OnceLock};

use libloading::Library;

use super::pci::BusId;
use super::TopoError;

/// The far end of one active NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkEnd {
    /// The link's number on its GPU.
    pub link: u32,
    /// `None`: NVML would not say (seen in VMs, whose guests do not see the
    /// far end's address); counted like a switch link, which gives a pair
    /// of GPUs their link count.
    pub remote: Option<BusId>,
}

type Ret = c_int;
type Handle = *mut c_void;

const NVML_SUCCESS: Ret = 0;
const NVML_FEATURE_ENABLED: c_int = 1;
/// NVML's NVML_NVLINK_MAX_LINKS (18 on Hopper and Blackwell); higher link
/// numbers are refused with an error, which ends the scan.
const MAX_LINKS: c_uint = 18;

/// `nvmlPciInfo_t` as the `_v2`/`_v3` calls fill it.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

type InitFn = unsafe extern "C" fn() -> Ret;
type ByBusFn = unsafe extern "C" fn(*const c_char, *mut Handle) -> Ret;
type StateFn = unsafe extern "C" fn(Handle, c_uint, *mut c_int) -> Ret;
type RemoteFn = unsafe extern "C" fn(Handle, c_uint, *mut PciInfo) -> Ret;

/// NVML, initialised once for the process and never shut down.
pub(crate) struct Nvml {
    by_bus: ByBusFn,
    state: StateFn,
    remote: RemoteFn,
    // Last: the function pointers above point into it.
    _lib: Library,
}

/// The process's NVML, or why it could not be opened.
static NVML: OnceLock<Result<Mutex<Nvml>, TopoError>> = OnceLock::new();

impl Nvml {
    /// The process's NVML, for one caller at a time. Ranks of one process
    /// detect their topology on threads of their own at once; each opening
    /// and shutting NVML down itself, one rank's shutdown raced another's
    /// queries, which then failed ("not supported") and made an NVLink
    /// pair look like PCIe (4 channels instead of 24, a quarter of the
    /// bandwidth, on 2 H200 in one process, 2026-11-29). NCCL, too, keeps
    /// NVML open and calls it under one lock.
    pub fn shared() -> Result<MutexGuard<'static, Nvml>, TopoError> {
        match NVML.get_or_init(|| Nvml::open().map(Mutex::new)) {
            // A panic while the lock was held left no NVML state half
            // changed: every call here is a query.
            Ok(m) => Ok(m.lock().unwrap_or_else(|p| p.into_inner())),
            Err(e) => Err(e.clone()),
        }
    }

    fn open() -> Result<Nvml, TopoError> {
        const NAME: &str = "libnvidia-ml.so.1";
        // SAFETY: loading NVML runs no initialiser beyond the library's own
        // static constructors, which the driver installs for this use.
        let lib = unsafe { Library::new(NAME) }.map_err(|e| TopoError::NoNvml(e.to_string()))?;
        let sym = |name: &'static str| TopoError::NvmlSymbol(name);
        // SAFETY: each type is the C prototype of the named function in
        // nvml.h; the pointers are used only while `lib` lives (held below).
        let (init, by_bus, state, remote) = unsafe {
            (
                *lib.get::<InitFn>(b"nvmlInit_v2\0")
                    .map_err(|_| sym("nvmlInit_v2"))?,
                *lib.get::<ByBusFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                    .map_err(|_| sym("nvmlDeviceGetHandleByPciBusId_v2"))?,
                *lib.get::<StateFn>(b"nvmlDeviceGetNvLinkState\0")
                    .map_err(|_| sym("nvmlDeviceGetNvLinkState"))?,
                *lib.get::<RemoteFn>(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0")
                    .map_err(|_| sym("nvmlDeviceGetNvLinkRemotePciInfo_v2"))?,
            )
        };
        // SAFETY: takes no arguments; NVML counts its inits, so other users
        // of NVML in the process are not disturbed by ours.
        let r = unsafe { init() };
        if r != NVML_SUCCESS {
            return Err(TopoError::Nvml {
                call: "nvmlInit_v2",
                code: r,
            });
        }
        Ok(Nvml {
            by_bus,
            state,
            remote,
            _lib: lib,
        })
    }

    fn handle(&self, gpu: BusId) -> Result<Handle, TopoError> {
        let id = CString::new(gpu.nvml()).map_err(|_| TopoError::BadBusId(gpu.to_string()))?;
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `id` is a terminated string and `h` a valid out-pointer.
        let r = unsafe { (self.by_bus)(id.as_ptr(), &mut h) };
        if r != NVML_SUCCESS {
            return Err(TopoError::Nvml {
                call: "nvmlDeviceGetHandleByPciBusId_v2",
                code: r,
            });
        }
        Ok(h)
    }

    /// Whether NVML knows a GPU at this address (an NVLink's far end that
    /// is not a GPU is a switch).
    pub fn is_gpu(&self, id: BusId) -> bool {
        self.handle(id).is_ok()
    }

    /// The active NVLinks of the GPU at `gpu` and what each reaches.
    pub fn links(&self, gpu: BusId) -> Result<Vec<LinkEnd>, TopoError> {
        let h = self.handle(gpu)?;
        let mut out = Vec::new();
        // The first refusal, reported when no link answered at all (a VM
        // may hide NVLink state from the guest) rather than "0 links".
        let mut refused = None;
        for link in 0..MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: `h` is a handle NVML gave; `active` a valid out-pointer.
            let r = unsafe { (self.state)(h, link, &mut active) };
            if r != NVML_SUCCESS {
                refused.get_or_insert(TopoError::Nvml {
                    call: "nvmlDeviceGetNvLinkState",
                    code: r,
                });
            }
            if r != NVML_SUCCESS || active != NVML_FEATURE_ENABLED {
                // Unsupported or absent links answer with an error: no link.
                continue;
            }
            // SAFETY: PciInfo is plain data; all zeroes is a valid value.
            let mut info: PciInfo = unsafe { std::mem::zeroed() };
            // SAFETY: `h` is valid; `info` has the layout the _v2 call writes.
            let r = unsafe { (self.remote)(h, link, &mut info) };
            if r != NVML_SUCCESS {
                out.push(LinkEnd { link, remote: None });
                continue;
            }
            // An unterminated answer must not run off the array.
            info.bus_id[31] = 0;
            // SAFETY: the array is terminated at the latest at its last byte.
            let s = unsafe { CStr::from_ptr(info.bus_id.as_ptr()) }.to_string_lossy();
            out.push(LinkEnd {
                link,
                remote: s.parse::<BusId>().ok(),
            });
        }
        match refused {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }
}
