//! Driver results as the crate's errors.

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// `Ok` on `CUDA_SUCCESS`, else a system error naming the call.
pub(crate) fn check(r: sys::CUresult, what: impl std::fmt::Display) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::System(format!("{what}: {r:?}")))
    }
}
