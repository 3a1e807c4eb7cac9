//! Where each part of a device-path area lies: the same on every rank
//! (checked at setup), since a rank computes offsets in its peers' areas
//! from its own layout, and the same for the three kinds of area (a GPU
//! window, a shared host area, a net peer's send mirror), so that the
//! kernel addresses all of them alike (see `kernels/cuda/coll.cu`).

use oxccl_kernels::FLAG_BYTES;

use crate::cuda::abi::WinHeader;

const PAGE: usize = 4096;

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
}

impl Layout {
    pub fn new(nranks: usize, channels: usize, slots: usize, slot_bytes: usize) -> Layout {
        // One cell per (peer, channel); the peer index skips this rank.
        let cells = nranks.saturating_sub(1) * channels;
        let off_tail = WinHeader::BYTES.next_multiple_of(PAGE);
        let off_head = off_tail + cells * FLAG_BYTES;
        let off_state = off_head + cells * FLAG_BYTES;
        let off_size = off_state + cells * 16;
        let off_fifo = (off_size + cells * slots * 8).next_multiple_of(PAGE);
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
        }
    }

    /// The cell of the connection `from -> to` on `chan`, in `to`'s area
    /// (the kernel's `cell(pidx(from, to, n))`).
    pub fn cell(&self, from: usize, to: usize, chan: usize) -> usize {
        let n = self.nranks;
        let pidx = (from + n - to - 1) % n;
        pidx * self.maxch + chan
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_do_not_overlap() {
        let l = Layout::new(3, 4, 8, 1 << 16);
        let cells = 2 * 4;
        assert!(l.off_tail >= WinHeader::BYTES);
        assert_eq!(l.off_head - l.off_tail, cells * FLAG_BYTES);
        assert!(l.off_size >= l.off_state + cells * 16);
        assert!(l.off_fifo >= l.size(cells - 1, 7) + 8);
        assert_eq!(l.off_fifo % PAGE, 0);
        assert_eq!(l.bytes, l.slot(cells - 1, 7) + l.slot_bytes);
        // Rank 2 -> 0 and 1 -> 0 land in different cells of 0's area, as
        // 0 -> 1 and 2 -> 1 in 1's.
        assert_ne!(l.cell(2, 0, 1), l.cell(1, 0, 1));
        assert_ne!(l.cell(0, 1, 3), l.cell(2, 1, 3));
        assert!(l.cell(1, 0, 3) < cells);
        assert_eq!(l.slots(5), (l.slot(5, 0), 8 << 16));
    }
}
