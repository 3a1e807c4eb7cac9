//! NVTX ranges for Nsight Systems, loaded only when a tool is attached: the
//! library is opened at the first event if `nsys` (or another NVTX tool)
//! announced itself through the environment, and never otherwise, so a
//! normal run pays one relaxed load per event.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::OnceLock;

type RangeStart = unsafe extern "C" fn(*const c_char) -> u64;
type RangeEnd = unsafe extern "C" fn(u64);

/// The NVTX entry points used: start/end ranges (not push/pop), because
/// NCCL may stop an event on another thread than the one that started it.
pub struct Nvtx {
    start: RangeStart,
    end: RangeEnd,
    _lib: libloading::Library,
}

static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();

/// Variables by which Nsight Systems (and NVTX tools in general) make
/// themselves known to the process.
const TOOL_ENV: [&str; 2] = ["NVTX_INJECTION64_PATH", "NSYS_PROFILING_SESSION_ID"];

fn load() -> Option<Nvtx> {
    if !TOOL_ENV.iter().any(|k| std::env::var_os(k).is_some()) {
        return None;
    }
    // SAFETY: libnvToolsExt is NVIDIA's NVTX library; loading it runs no
    // initialiser with preconditions (it hooks the tool on first call).
    let lib = unsafe { libloading::Library::new("libnvToolsExt.so.1") }.ok()?;
    // SAFETY: the documented NVTX C signatures of these two symbols.
    let (start, end) = unsafe {
        let s: RangeStart = *lib.get::<RangeStart>(b"nvtxRangeStartA\0").ok()?;
        let e: RangeEnd = *lib.get::<RangeEnd>(b"nvtxRangeEnd\0").ok()?;
        (s, e)
    };
    Some(Nvtx {
        start,
        end,
        _lib: lib,
    })
}

/// The NVTX library if a tool is attached.
pub fn get() -> Option<&'static Nvtx> {
    NVTX.get_or_init(load).as_ref()
}

impl Nvtx {
    /// Opens a range; its id goes to [`Nvtx::end`].
    pub fn start(&self, name: &str) -> u64 {
        let Ok(c) = CString::new(name) else {
            return 0;
        };
        // SAFETY: a NUL-terminated string valid for the call (NVTX copies it).
        unsafe { (self.start)(c.as_ptr()) }
    }

    /// Closes a range opened by [`Nvtx::start`].
    pub fn end(&self, id: u64) {
        // SAFETY: `id` came from nvtxRangeStartA of the same library.
        unsafe { (self.end)(id) }
    }
}
