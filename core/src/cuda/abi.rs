//! The structs shared with the device code, field for field as declared in
//! `kernels/cuda/*.cu` (the layout tests below pin sizes and offsets).

use oxccl_kernels::{MAX_RANKS, MAX_STEPS};

use super::module::KernelArg;

/// Which user buffer a step addresses (`OXCCL_BUF_*`).
pub const BUF_NONE: u8 = 0;
pub const BUF_INPUT: u8 = 1;
pub const BUF_OUTPUT: u8 = 2;
/// A step over the channel's whole range rather than one chunk of it.
pub const CHUNK_WHOLE: u8 = 0xff;
/// `OXCCL_STEP_*`.
pub const STEP_SEND_LOCAL: u8 = 1;
pub const STEP_FINALIZE: u8 = 2;
/// Steps of one of the double binary tree's trees, run by the even (odd)
/// channels only.
pub const STEP_EVEN_CH: u8 = 4;
pub const STEP_ODD_CH: u8 = 8;

/// Whether a step with `flags` runs on channel `ch`.
pub fn runs_on_channel(flags: u8, ch: usize) -> bool {
    let other = if ch % 2 == 1 {
        STEP_EVEN_CH
    } else {
        STEP_ODD_CH
    };
    flags & other == 0
}
/// `OXCCL_PROTO_*`.
pub const PROTO_SIMPLE: u32 = 0;
pub const PROTO_LL: u32 = 1;
/// `OXCCL_F_*` of the reduce kernel.
pub const F_PRE_A: u32 = 1;
pub const F_PRE_B: u32 = 2;
pub const F_POST: u32 = 4;

/// An op's scalars, converted on the host once per type they are used in.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scalars {
    pub f64: f64,
    pub int: u64,
    pub div: u64,
    pub f32: f32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevStep {
    pub recv: i16,
    pub send: i16,
    pub src_buf: u8,
    pub dst_buf: u8,
    pub chunk: u8,
    pub flags: u8,
    pub src_block: u16,
    pub dst_block: u16,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollArgs {
    pub comm: u64,
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub sc: Scalars,
    pub timeout_ns: u64,
    pub nsteps: u32,
    pub nchunks: u32,
    pub slice_elems: u32,
    pub nchannels: u32,
    /// Slices a step moves before the next step moves (a chunk).
    pub group: u32,
    /// Which FIFO the launch moves its slices through: [`PROTO_SIMPLE`] or
    /// [`PROTO_LL`].
    pub proto: u32,
    /// Mapped host address of the launch's (start, end) globaltimer pairs,
    /// one per channel; 0 when the launch is not timed.
    pub stamps: u64,
    /// Mapped host address of the word that ends the launch when set (a
    /// revoke; see [`crate::exec::device::DeviceStop`]); 0: none.
    pub abort: u64,
    /// Registered buffers: the peers (a bit per rank) that read this
    /// rank's input, resp. output, where it lies (at this process's
    /// addresses), so that slices sent to them from there post their
    /// address instead of their bytes; and the peers that may post so to
    /// this rank (see `direct_in` in coll.cu). 0: none.
    pub direct_in: u64,
    pub direct_out: u64,
    pub direct_from: u64,
    pub steps: [DevStep; MAX_STEPS],
}

/// Inputs and outputs of one local reduce launch (`OXCCL_LOCAL_MAX`).
pub const LOCAL_MAX: usize = 8;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReduceArgs {
    pub inputs: [u64; LOCAL_MAX],
    pub outputs: [u64; LOCAL_MAX],
    pub count: u64,
    pub sc: Scalars,
    pub flags: u32,
    pub nin: u32,
    pub nout: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CopyArgs {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FillArgs {
    pub dst: u64,
    pub count: u64,
    pub seed: u64,
    pub modulus: u64,
    pub offset: i64,
}

// SAFETY: each mirrors, with #[repr(C)] and the same field types, the
// parameter struct of the kernels it is launched with (coll.cu, local.cu);
// they hold device addresses and numbers only.
unsafe impl KernelArg for CollArgs {}
// SAFETY: as above (ReduceArgs in local.cu).
unsafe impl KernelArg for ReduceArgs {}
// SAFETY: as above (CopyArgs in local.cu).
unsafe impl KernelArg for CopyArgs {}
// SAFETY: as above (FillArgs in local.cu).
unsafe impl KernelArg for FillArgs {}

/// The header at offset 0 of every window (`WinHeader` in coll.cu).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WinHeader {
    pub off_tail: u64,
    pub off_head: u64,
    pub off_state: u64,
    pub off_fifo: u64,
    pub off_size: u64,
    pub slot_bytes: u64,
    pub nslots: u32,
    pub maxch: u32,
    pub rank: u32,
    pub nranks: u32,
    /// The LL FIFO's parts (see `transport::layout`), in the same areas.
    pub off_tail_ll: u64,
    pub off_head_ll: u64,
    pub off_size_ll: u64,
    pub off_fifo_ll: u64,
    pub ll_slot_bytes: u64,
    /// The area each rank receives this rank's slices in.
    pub peer: [u64; MAX_RANKS],
    /// The area this rank receives each rank's slices in.
    pub mine: [u64; MAX_RANKS],
    /// Slot 0 of cell 0 of the slots matching `peer`: in the area itself
    /// (`peer + off_fifo`), or in device memory the network reads
    /// (GPUDirect).
    pub fifo_peer: [u64; MAX_RANKS],
    /// The same for `mine`.
    pub fifo_mine: [u64; MAX_RANKS],
}

impl WinHeader {
    pub const BYTES: usize = 104 + 32 * MAX_RANKS;

    /// The bytes the device reads (little-endian, as every CUDA GPU).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::BYTES);
        for v in [
            self.off_tail,
            self.off_head,
            self.off_state,
            self.off_fifo,
            self.off_size,
            self.slot_bytes,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.nslots, self.maxch, self.rank, self.nranks] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.off_tail_ll,
            self.off_head_ll,
            self.off_size_ll,
            self.off_fifo_ll,
            self.ll_slot_bytes,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in self
            .peer
            .iter()
            .chain(&self.mine)
            .chain(&self.fifo_peer)
            .chain(&self.fifo_mine)
        {
            b.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(b.len(), Self::BYTES);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_device_structs() {
        assert_eq!(size_of::<Scalars>(), 32);
        assert_eq!(size_of::<DevStep>(), 16);
        assert_eq!(offset_of!(DevStep, src_block), 8);
        assert_eq!(offset_of!(CollArgs, sc), 32);
        assert_eq!(offset_of!(CollArgs, timeout_ns), 64);
        assert_eq!(offset_of!(CollArgs, nsteps), 72);
        assert_eq!(offset_of!(CollArgs, nchannels), 84);
        assert_eq!(offset_of!(CollArgs, group), 88);
        assert_eq!(offset_of!(CollArgs, stamps), 96);
        assert_eq!(offset_of!(CollArgs, abort), 104);
        assert_eq!(offset_of!(CollArgs, direct_in), 112);
        assert_eq!(offset_of!(CollArgs, direct_from), 128);
        assert_eq!(offset_of!(CollArgs, steps), 136);
        assert_eq!(size_of::<CollArgs>(), 136 + 16 * MAX_STEPS);
        assert_eq!(offset_of!(ReduceArgs, count), 128);
        assert_eq!(offset_of!(ReduceArgs, flags), 168);
        assert_eq!(size_of::<ReduceArgs>(), 184);
        assert_eq!(size_of::<CopyArgs>(), 24);
        assert_eq!(size_of::<FillArgs>(), 40);
        assert_eq!(offset_of!(CollArgs, proto), 92);
        assert_eq!(WinHeader::BYTES, 2152);
    }
}
