//! Ring schedules (and the chains that broadcast and reduce use): each rank
//! receives from its predecessor and sends to its successor, so every link
//! carries data at once and the bus bandwidth approaches the link's.

use super::{split, Region, Step};

/// A rank's place in the ring `order` (the ranks in ring order): ranks of
/// one node sit next to each other there, so the ring crosses between
/// nodes once per node.
struct Place<'a> {
    order: &'a [usize],
    pos: usize,
}

impl<'a> Place<'a> {
    fn of(rank: usize, order: &'a [usize]) -> Place<'a> {
        let pos = order
            .iter()
            .position(|&r| r == rank)
            .expect("every rank is in the ring");
        Place { order, pos }
    }
    fn n(&self) -> usize {
        self.order.len()
    }
    fn next(&self) -> usize {
        self.order[(self.pos + 1) % self.n()]
    }
    fn prev(&self) -> usize {
        self.order[(self.pos + self.n() - 1) % self.n()]
    }
    /// Positions from `root` to this rank, going forward.
    fn from(&self, root: usize) -> usize {
        let r = Place::of(root, self.order).pos;
        (self.pos + self.n() - r) % self.n()
    }
}

/// Chunk index this position handles at step `s` of a reduce-scatter
/// pass, so that the last step (`n - 1`) reduces the chunk numbered `pos`.
fn rs_chunk(pos: usize, n: usize, s: usize) -> usize {
    (pos + 2 * n - s - 1) % n
}

/// Reduce-scatter, then all-gather, over `n` chunks of `[lo, hi)`.
pub fn all_reduce(rank: usize, order: &[usize], lo: usize, hi: usize) -> Vec<Step> {
    let me = Place::of(rank, order);
    let n = me.n();
    let chunk = |c: usize| split(lo, hi, n, c);
    let (nx, pv) = (me.next(), me.prev());
    let mut steps = Vec::with_capacity(2 * n - 1);
    for s in 0..n {
        let (a, b) = chunk(rs_chunk(me.pos, n, s));
        let step = Step::new(b - a).src(Region::input(a)).send(nx);
        steps.push(match s {
            0 => step,
            s if s == n - 1 => step.recv(pv).dst(Region::output(a)).finalize(),
            _ => step.recv(pv),
        });
    }
    for k in 1..n {
        let (a, b) = chunk((me.pos + n - k) % n);
        let step = Step::new(b - a).recv(pv).dst(Region::output(a));
        steps.push(if k < n - 1 { step.send(nx) } else { step });
    }
    steps
}

/// Each rank's block `[lo, hi)` of `count` travels around the ring into
/// `output[rank * count ..]`.
pub fn all_gather(rank: usize, order: &[usize], count: usize, lo: usize, hi: usize) -> Vec<Step> {
    let me = Place::of(rank, order);
    let n = me.n();
    let (nx, pv) = (me.next(), me.prev());
    let mut steps = vec![Step::new(hi - lo)
        .src(Region::input(lo))
        .dst(Region::output(rank * count + lo))
        .send(nx)];
    for k in 1..n {
        let owner = order[(me.pos + n - k) % n];
        let step = Step::new(hi - lo)
            .recv(pv)
            .dst(Region::output(owner * count + lo));
        steps.push(if k < n - 1 { step.send(nx) } else { step });
    }
    steps
}

/// Input holds `n` blocks of `count`; rank r ends with the reduction of
/// block r in `output[..count]`.
pub fn reduce_scatter(
    rank: usize,
    order: &[usize],
    count: usize,
    lo: usize,
    hi: usize,
) -> Vec<Step> {
    let me = Place::of(rank, order);
    let n = me.n();
    let (nx, pv) = (me.next(), me.prev());
    (0..n)
        .map(|s| {
            let block = order[rs_chunk(me.pos, n, s)];
            let step = Step::new(hi - lo).src(Region::input(block * count + lo));
            match s {
                0 => step.send(nx),
                s if s == n - 1 => step.recv(pv).dst(Region::output(lo)).finalize(),
                _ => step.recv(pv).send(nx),
            }
        })
        .collect()
}

/// A chain from the root through every rank, pipelined slice by slice.
pub fn broadcast(rank: usize, order: &[usize], root: usize, lo: usize, hi: usize) -> Vec<Step> {
    let me = Place::of(rank, order);
    let n = me.n();
    let step = Step::new(hi - lo).dst(Region::output(lo));
    vec![match me.from(root) {
        0 => step.src(Region::input(lo)).send(me.next()),
        p if p == n - 1 => step.recv(me.prev()),
        _ => step.recv(me.prev()).send(me.next()),
    }]
}

/// A chain ending at the root, each rank adding its input on the way.
pub fn reduce(rank: usize, order: &[usize], root: usize, lo: usize, hi: usize) -> Vec<Step> {
    let me = Place::of(rank, order);
    let n = me.n();
    let step = Step::new(hi - lo).src(Region::input(lo));
    vec![match (me.from(root) + n - 1) % n {
        0 => step.send(me.next()),
        p if p == n - 1 => step.recv(me.prev()).dst(Region::output(lo)).finalize(),
        _ => step.recv(me.prev()).send(me.next()),
    }]
}
