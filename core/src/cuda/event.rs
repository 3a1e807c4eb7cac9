//! Events: ordering between streams without the host, and timing.

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use super::stream::RawStream;
use crate::error::Result;

#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    raw: sys::CUevent,
}

// SAFETY: an event handle may be used from any thread with its context current.
unsafe impl Send for Event {}
// SAFETY: as for Send.
unsafe impl Sync for Event {}

impl Event {
    /// `timing: false` makes record and wait cheaper (ordering only).
    pub fn new(ctx: &Arc<Context>, timing: bool) -> Result<Event> {
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        check(
            // SAFETY: `raw` is a valid out-pointer; the context is current.
            unsafe { sys::cuEventCreate(&mut raw, flags as u32) },
            "cuEventCreate",
        )?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// Captures the work enqueued on `stream` so far.
    pub fn record(&self, stream: RawStream) -> Result<()> {
        self.ctx.bind()?;
        check(
            // SAFETY: the event is live; the stream is valid by its contract.
            unsafe { sys::cuEventRecord(self.raw, stream.sys()) },
            "cuEventRecord",
        )
    }

    /// Makes later work on `stream` wait for the recorded work (on the GPU).
    pub fn wait_on(&self, stream: RawStream) -> Result<()> {
        self.ctx.bind()?;
        check(
            // SAFETY: the event is live; the stream is valid by its contract.
            unsafe { sys::cuStreamWaitEvent(stream.sys(), self.raw, 0) },
            "cuStreamWaitEvent",
        )
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        check(
            // SAFETY: the event is live.
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    /// Whether the recorded work is done, without waiting for it.
    pub fn query(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the event is live.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuEventQuery").map(|_| true)
    }

    /// Milliseconds from `start` to `self`, both recorded and complete.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        let mut ms = 0f32;
        check(
            // SAFETY: `ms` is a valid out-pointer; both events are live.
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}
