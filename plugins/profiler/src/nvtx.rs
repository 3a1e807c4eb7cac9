//! NVTX ranges for Nsight Systems, through NVTX3 (NVIDIA's `nvtx` crate
//! builds NVTX3's loader into this library). NVTX3 attaches a tool only
//! through `NVTX_INJECTION64_PATH`, which is how `nsys` injects itself: the
//! library named there gets NVTX's callback tables at the first NVTX call.
//! NVTX v2's `libnvToolsExt.so.1` is not used: CUDA 12 and later do not
//! ship it.
//!
//! Without that variable no NVTX call is made at all, not even the domain's
//! creation, so a normal run pays one load of an initialised `OnceLock` per
//! event.
//!
//! Ranges are start/end, not push/pop, because NCCL may stop an event on
//! another thread than the one that started it; they live in the domain
//! `oxccl`, and the names NCCL uses are registered once, so that starting a
//! range passes a handle rather than a string.

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use nvtx::domain::{Range, RegisteredString};
use nvtx::Domain;

/// The variable through which NVTX3 finds the tool to load.
pub const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";

/// The domain every range of this plugin belongs to.
pub const DOMAIN: &CStr = c"oxccl";

/// The event names that get ranges (groups, collectives, p2p, API calls),
/// registered when the domain is created. Others go as plain strings.
const NAMES: &[&CStr] = &[
    c"Group",
    c"GroupApi",
    c"AllReduce",
    c"Broadcast",
    c"Reduce",
    c"AllGather",
    c"ReduceScatter",
    c"Send",
    c"Recv",
    c"SendRecv",
    c"AllToAll",
    c"Gather",
    c"Scatter",
    c"AllGatherV",
];

/// NVTX state while a tool is attached.
pub struct Nvtx {
    /// Leaked once per process: ranges and registered strings borrow it,
    /// and they travel between threads inside open events.
    domain: &'static Domain,
    names: Vec<(&'static CStr, RegisteredString<'static>)>,
}

/// An open range; [`end`] (or dropping it) ends it, on any thread.
pub type NvtxRange = Range<'static>;

static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();

fn load() -> Option<Nvtx> {
    // An empty value would make NVTX3 dlopen("") (the main program), which
    // is never a tool.
    std::env::var_os(INJECTION_ENV).filter(|v| !v.is_empty())?;
    let domain: &'static Domain = Box::leak(Box::new(Domain::new(DOMAIN)));
    let names = NAMES
        .iter()
        .map(|&n| (n, domain.register_string(n)))
        .collect();
    Some(Nvtx { domain, names })
}

/// NVTX if a tool is attached.
pub fn get() -> Option<&'static Nvtx> {
    NVTX.get_or_init(load).as_ref()
}

impl Nvtx {
    /// Opens a range named `name` in the `oxccl` domain.
    pub fn start(&self, name: &str) -> NvtxRange {
        match self
            .names
            .iter()
            .find(|(n, _)| n.to_bytes() == name.as_bytes())
        {
            Some((_, r)) => self.domain.range(*r),
            None => {
                // NCCL's names are C strings, so a NUL inside one cannot
                // happen; cut there if it ever does.
                let cut = name.split('\0').next().unwrap_or_default();
                let c = CString::new(cut).unwrap_or_default();
                self.domain.range(c)
            }
        }
    }
}

/// Closes a range opened by [`Nvtx::start`] (`nvtxDomainRangeEnd`).
pub fn end(range: NvtxRange) {
    drop(range)
}
