//! Where each part of a device-path area lies: the same on every rank
//! (checked at setup), since a rank computes offsets in its peers' areas
//! from its own layout, and the same for the three kinds of area (a GPU
//! window, a shared host area, a net peer's send mirror), so that the
//! kernel addresses all of them alike (see `kernels/cuda/coll.cu`).
//!
//! Each connection has two FIFOs with counters of their own: the simple
//! one (slots of `slot_bytes`, the data as it is, a fence before each
//! post) and, where `ll_slot_bytes` is not 0, the low-latency one (NCCL's
//! LL: slots of 16-byte lines, each 8 bytes of data beside two copies of a
//! flag that names the step, so that a reader polls the data itself and a
//! writer needs no fence). The LL slots lie before `off_fifo`, in the part
//! of an area that is always host memory for the network (the simple slots
//! may be in GPU memory), and in a GPU window for P2P peers.

use oxccl_kernels::FLAG_BYTES;

use crate::cuda::abi::WinHeader;

const PAGE: usize = 4096;

/// The kernel's counters per (peer, channel): 4 u64 for each FIFO.
const STATE_BYTES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub nranks: usize,
    pub nslots: usize,
    pub maxch: usize,
    pub slot_bytes: usize,
    pub off_tail: usize,
    pub off_head: usize,
    pub off_state: usize,
    pub off_size: usize,
    pub off_fifo: usize,
    pub bytes: usize,
    /// The LL FIFO's parts, in the same shapes (empty where
    /// `ll_slot_bytes` is 0).
    pub ll_slot_bytes: usize,
    pub off_tail_ll: usize,
    pub off_head_ll: usize,
    pub off_size_ll: usize,
    pub off_fifo_ll: usize,
}

/// Which of a connection's FIFOs: the protocol a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Simple,
    Ll,
}

impl Proto {
    /// NCCL's name.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Simple => "Simple",
            Proto::Ll => "LL",
        }
    }
}

/// One FIFO's offsets in an area: what the proxy needs of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fifo {
    pub proto: Proto,
    pub nslots: usize,
    pub slot_bytes: usize,
    pub off_tail: usize,
    pub off_head: usize,
    pub off_size: usize,
    pub off_fifo: usize,
}

impl Fifo {
    pub fn tail(&self, cell: usize) -> usize {
        self.off_tail + cell * FLAG_BYTES
    }

    pub fn head(&self, cell: usize) -> usize {
        self.off_head + cell * FLAG_BYTES
    }

    /// The word holding the bytes stored into slot `step % nslots`.
    pub fn size(&self, cell: usize, step: u64) -> usize {
        self.off_size + (cell * self.nslots + (step % self.nslots as u64) as usize) * 8
    }

    pub fn slot(&self, cell: usize, step: u64) -> usize {
        self.off_fifo
            + (cell * self.nslots + (step % self.nslots as u64) as usize) * self.slot_bytes
    }

    /// Every slot of a cell, one span (for one registration per connection).
    pub fn slots(&self, cell: usize) -> (usize, usize) {
        (self.slot(cell, 0), self.nslots * self.slot_bytes)
    }
}

/// The flag an LL line of `step` carries (coll.cu's `oxccl_ll_flag`):
/// never 0, which zeroed memory holds, and different from the flags of the
/// steps that used its slot before.
pub fn ll_flag(step: u64) -> u32 {
    (step as u32).wrapping_add(1).max(1)
}

/// Bytes of one LL line, and of the data it carries.
pub const LL_LINE: usize = 16;
pub const LL_DATA: usize = 8;

impl Layout {
    pub fn new(
        nranks: usize,
        channels: usize,
        slots: usize,
        slot_bytes: usize,
        ll_slot_bytes: usize,
    ) -> Layout {
        // One cell per (peer, channel); the peer index skips this rank.
        let cells = nranks.saturating_sub(1) * channels;
        let off_tail = WinHeader::BYTES.next_multiple_of(PAGE);
        let off_head = off_tail + cells * FLAG_BYTES;
        let off_state = off_head + cells * FLAG_BYTES;
        // Per cell, the kernel's: the simple FIFO's send and receive
        // counters and the highest head and tail it has read, then the LL
        // FIFO's.
        let off_size = off_state + cells * STATE_BYTES;
        let off_tail_ll = off_size + cells * slots * 8;
        let ll_cells = if ll_slot_bytes > 0 { cells } else { 0 };
        let off_head_ll = off_tail_ll + ll_cells * FLAG_BYTES;
        let off_size_ll = off_head_ll + ll_cells * FLAG_BYTES;
        let off_fifo_ll = (off_size_ll + ll_cells * slots * 8).next_multiple_of(PAGE);
        let off_fifo = (off_fifo_ll + ll_cells * slots * ll_slot_bytes).next_multiple_of(PAGE);
        Layout {
            nranks,
            nslots: slots,
            maxch: channels,
            slot_bytes,
            off_tail,
            off_head,
            off_state,
            off_size,
            off_fifo,
            bytes: off_fifo + cells * slots * slot_bytes,
            ll_slot_bytes,
            off_tail_ll,
            off_head_ll,
            off_size_ll,
            off_fifo_ll,
        }
    }

    pub fn fifo(&self, proto: Proto) -> Fifo {
        match proto {
            Proto::Simple => Fifo {
                proto,
                nslots: self.nslots,
                slot_bytes: self.slot_bytes,
                off_tail: self.off_tail,
                off_head: self.off_head,
                off_size: self.off_size,
                off_fifo: self.off_fifo,
            },
            Proto::Ll => Fifo {
                proto,
                nslots: self.nslots,
                slot_bytes: self.ll_slot_bytes,
                off_tail: self.off_tail_ll,
                off_head: self.off_head_ll,
                off_size: self.off_size_ll,
                off_fifo: self.off_fifo_ll,
            },
        }
    }

    /// Whether connections have an LL FIFO.
    pub fn has_ll(&self) -> bool {
        self.ll_slot_bytes > 0
    }

    /// The cell of the connection `from -> to` on `chan`, in `to`'s area
    /// (the kernel's `cell(pidx(from, to, n))`).
    pub fn cell(&self, from: usize, to: usize, chan: usize) -> usize {
        let n = self.nranks;
        let pidx = (from + n - to - 1) % n;
        pidx * self.maxch + chan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_do_not_overlap() {
        let l = Layout::new(3, 4, 8, 1 << 16, 0);
        let cells = 2 * 4;
        let f = l.fifo(Proto::Simple);
        assert!(l.off_tail >= WinHeader::BYTES);
        assert_eq!(l.off_head - l.off_tail, cells * FLAG_BYTES);
        assert!(l.off_size >= l.off_state + cells * STATE_BYTES);
        assert!(l.off_fifo >= f.size(cells - 1, 7) + 8);
        assert!(!l.has_ll());
        assert_eq!(l.off_fifo % PAGE, 0);
        assert_eq!(l.bytes, f.slot(cells - 1, 7) + l.slot_bytes);
        // Rank 2 -> 0 and 1 -> 0 land in different cells of 0's area, as
        // 0 -> 1 and 2 -> 1 in 1's.
        assert_ne!(l.cell(2, 0, 1), l.cell(1, 0, 1));
        assert_ne!(l.cell(0, 1, 3), l.cell(2, 1, 3));
        assert!(l.cell(1, 0, 3) < cells);
        assert_eq!(f.slots(5), (f.slot(5, 0), 8 << 16));
    }

    #[test]
    fn the_ll_fifo_lies_between_the_counters_and_the_simple_slots() {
        let l = Layout::new(3, 4, 8, 1 << 16, 4096);
        let cells = 2 * 4;
        let ll = l.fifo(Proto::Ll);
        assert!(l.has_ll());
        assert!(ll.tail(0) >= l.fifo(Proto::Simple).size(cells - 1, 7) + 8);
        assert!(ll.head(0) >= ll.tail(cells - 1) + FLAG_BYTES);
        assert!(ll.size(0, 0) >= ll.head(cells - 1) + FLAG_BYTES);
        assert!(ll.slot(0, 0) >= ll.size(cells - 1, 7) + 8);
        assert!(l.off_fifo >= ll.slot(cells - 1, 7) + 4096);
        assert_eq!(ll.slots(3), (ll.slot(3, 0), 8 * 4096));
        assert_eq!(l.fifo(Proto::Simple).off_fifo, l.off_fifo);
        assert_eq!(ll_flag(0), 1);
        assert_ne!(ll_flag(u32::MAX as u64), 0);
        assert_ne!(ll_flag(5), ll_flag(5 + 8));
    }
}
