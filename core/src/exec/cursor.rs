//! The order a lane opens its steps' slices in.

use super::GROUP;
use crate::algo::Step;

/// The order slices are opened in: `GROUP` slices of every step, then the
/// next `GROUP` of every step, and so on (NCCL's loops run chunk by chunk
/// over the steps in the same way). Both ends of a connection open their
/// matching steps in the same order, so messages still meet in FIFO order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    /// Elements per slice, and the most slices any step has: fixed for
    /// the lane, so counted once rather than at every poll.
    slice: usize,
    most: usize,
    group: usize,
    step: usize,
    /// Slices of `step` already opened in this group.
    taken: usize,
}

impl Cursor {
    pub(super) fn new(steps: &[Step], slice: usize) -> Cursor {
        let slice = slice.max(1);
        Cursor {
            slice,
            most: steps
                .iter()
                .map(|s| s.count.div_ceil(slice))
                .max()
                .unwrap_or(0),
            group: 0,
            step: 0,
            taken: 0,
        }
    }

    /// The next slice to open, as (step, element offset, elements), without
    /// moving; `None` once every slice is open. Steps of zero elements
    /// have no slices.
    pub(super) fn peek(&self, steps: &[Step]) -> Option<(usize, usize, usize)> {
        let mut c = *self;
        c.next(steps)
    }

    pub(super) fn advance(&mut self, steps: &[Step]) {
        let _ = self.next(steps);
    }

    pub(super) fn next(&mut self, steps: &[Step]) -> Option<(usize, usize, usize)> {
        let slice = self.slice;
        loop {
            if self.step >= steps.len() {
                self.step = 0;
                self.taken = 0;
                self.group += 1;
            }
            if self.group * GROUP >= self.most {
                return None;
            }
            let count = steps[self.step].count;
            let idx = self.group * GROUP + self.taken;
            if self.taken < GROUP && idx < count.div_ceil(slice) {
                self.taken += 1;
                let off = idx * slice;
                return Some((self.step, off, slice.min(count - off)));
            }
            self.step += 1;
            self.taken = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Cursor, GROUP};
    use crate::algo::Step;

    pub(super) fn order(counts: &[usize], slice: usize) -> Vec<(usize, usize, usize)> {
        let steps: Vec<Step> = counts.iter().map(|&c| Step::new(c)).collect();
        let mut c = Cursor::new(&steps, slice);
        let mut out = Vec::new();
        while let Some(x) = c.peek(&steps) {
            c.advance(&steps);
            out.push(x);
        }
        out
    }

    #[test]
    pub(super) fn groups_of_slices_step_by_step_cover_everything_once() {
        assert_eq!(GROUP, 2);
        assert_eq!(
            order(&[5, 0, 3], 1),
            vec![
                (0, 0, 1),
                (0, 1, 1),
                (2, 0, 1),
                (2, 1, 1),
                (0, 2, 1),
                (0, 3, 1),
                (2, 2, 1),
                (0, 4, 1)
            ]
        );
        // A ragged last slice, and steps of different lengths.
        let o = order(&[10, 7], 4);
        assert_eq!(
            o,
            vec![(0, 0, 4), (0, 4, 4), (1, 0, 4), (1, 4, 3), (0, 8, 2)]
        );
        assert!(order(&[0, 0], 4).is_empty());
        assert!(order(&[], 4).is_empty());
    }
}
