//! Recursive doubling all-reduce: ceil(log2 n) exchanges of the whole
//! buffer, the latency algorithm for small messages.
//!
//! For n not a power of two, the first 2r ranks (r = n - 2^k) fold in
//! pairs first: even ranks hand their input to the odd neighbour and get the
//! result back at the end. Every combine is `mine (op) theirs`, and the ops
//! are commutative, so every rank ends with the same bits.

use super::{Region, Step};

pub fn all_reduce(rank: usize, n: usize, lo: usize, hi: usize) -> Vec<Step> {
    let count = hi - lo;
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let r = n - p;
    let mut steps = Vec::new();
    let out = Region::output(lo);
    if rank < 2 * r && rank.is_multiple_of(2) {
        steps.push(Step::new(count).src(Region::input(lo)).send(rank + 1));
        steps.push(Step::new(count).recv(rank + 1).dst(out));
        return steps;
    }
    let (new_rank, folded) = if rank < 2 * r {
        (rank / 2, true)
    } else {
        (rank - r, false)
    };
    let real = |nr: usize| if nr < r { nr * 2 + 1 } else { nr + r };
    let rounds = p.trailing_zeros() as usize;
    // The current value starts in the input; after the first combine it lives in the output.
    let mut cur = Region::input(lo);
    if folded {
        let s = Step::new(count).recv(rank - 1).src(cur).dst(out);
        steps.push(if rounds == 0 { s.finalize() } else { s });
        cur = out;
    }
    for k in 0..rounds {
        let partner = real(new_rank ^ (1 << k));
        let s = Step::new(count)
            .send(partner)
            .recv(partner)
            .src(cur)
            .dst(out)
            .send_local();
        steps.push(if k + 1 == rounds { s.finalize() } else { s });
        cur = out;
    }
    if folded {
        steps.push(Step::new(count).src(out).send(rank - 1));
    }
    steps
}
