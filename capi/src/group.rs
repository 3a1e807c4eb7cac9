//! Groups: calls between `ncclGroupStart` and `ncclGroupEnd` run together.

use oxccl::Error;

use crate::guard::{entry, ok};
use crate::types::*;

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    entry("ncclGroupStart", || {
        oxccl::group_start();
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    entry("ncclGroupEnd", || {
        let created = if oxccl::group::depth() == 1 {
            crate::comm::finish_deferred()
        } else {
            Ok(())
        };
        oxccl::group_end()?;
        created?;
        ok()
    })
}

/// Ends the group without running it; `simInfo->estimatedTime` gets the
/// cost model's prediction in microseconds.
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    entry("ncclGroupSimulateEnd", || {
        if !simInfo.is_null() {
            // SAFETY: non-null; `size` and `magic` lead every version of the struct.
            let (size, magic) = unsafe { ((*simInfo).size, (*simInfo).magic) };
            if magic != NCCL_SIM_INFO_MAGIC {
                // Close the group anyway so that the thread's depth stays right.
                let _ = oxccl::group_simulate_end();
                return Err(Error::InvalidArgument(format!(
                    "simInfo has magic {magic:#x}, not {NCCL_SIM_INFO_MAGIC:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER"
                )));
            }
            let secs = oxccl::group_simulate_end()?;
            if size >= std::mem::size_of::<ncclSimInfo_t>() {
                // SAFETY: non-null and large enough, per its own size field.
                unsafe { (*simInfo).estimatedTime = (secs * 1e6) as f32 };
            }
        } else {
            oxccl::group_simulate_end()?;
        }
        ok()
    })
}
