//! Ring schedules (and the chains that broadcast and reduce use): each rank
//! receives from its predecessor and sends to its successor, so every link
//! carries data at once and the bus bandwidth approaches the link's.

use super::{split, Region, Step};

fn next(rank: usize, n: usize) -> usize {
    (rank + 1) % n
}

fn prev(rank: usize, n: usize) -> usize {
    (rank + n - 1) % n
}

/// Chunk index this rank handles at step `s` of a reduce-scatter pass, so
/// that the last step (`n - 1`) reduces the chunk numbered `rank`.
fn rs_chunk(rank: usize, n: usize, s: usize) -> usize {
    (rank + 2 * n - s - 1) % n
}

/// Reduce-scatter, then all-gather, over `n` chunks of `[lo, hi)`.
pub fn all_reduce(rank: usize, n: usize, lo: usize, hi: usize) -> Vec<Step> {
    let chunk = |c: usize| split(lo, hi, n, c);
    let (nx, pv) = (next(rank, n), prev(rank, n));
    let mut steps = Vec::with_capacity(2 * n - 1);
    for s in 0..n {
        let (a, b) = chunk(rs_chunk(rank, n, s));
        let step = Step::new(b - a).src(Region::input(a)).send(nx);
        steps.push(match s {
            0 => step,
            s if s == n - 1 => step.recv(pv).dst(Region::output(a)).finalize(),
            _ => step.recv(pv),
        });
    }
    for k in 1..n {
        let (a, b) = chunk((rank + n - k) % n);
        let step = Step::new(b - a).recv(pv).dst(Region::output(a));
        steps.push(if k < n - 1 { step.send(nx) } else { step });
    }
    steps
}

/// Each rank's block `[lo, hi)` of `count` travels around the ring into
/// `output[rank * count ..]`.
pub fn all_gather(rank: usize, n: usize, count: usize, lo: usize, hi: usize) -> Vec<Step> {
    let (nx, pv) = (next(rank, n), prev(rank, n));
    let mut steps = vec![Step::new(hi - lo)
        .src(Region::input(lo))
        .dst(Region::output(rank * count + lo))
        .send(nx)];
    for k in 1..n {
        let owner = (rank + n - k) % n;
        let step = Step::new(hi - lo)
            .recv(pv)
            .dst(Region::output(owner * count + lo));
        steps.push(if k < n - 1 { step.send(nx) } else { step });
    }
    steps
}

/// Input holds `n` blocks of `count`; rank r ends with the reduction of
/// block r in `output[..count]`.
pub fn reduce_scatter(rank: usize, n: usize, count: usize, lo: usize, hi: usize) -> Vec<Step> {
    let (nx, pv) = (next(rank, n), prev(rank, n));
    (0..n)
        .map(|s| {
            let c = rs_chunk(rank, n, s);
            let step = Step::new(hi - lo).src(Region::input(c * count + lo));
            match s {
                0 => step.send(nx),
                s if s == n - 1 => step.recv(pv).dst(Region::output(lo)).finalize(),
                _ => step.recv(pv).send(nx),
            }
        })
        .collect()
}

/// A chain from the root through every rank, pipelined slice by slice.
pub fn broadcast(rank: usize, n: usize, root: usize, lo: usize, hi: usize) -> Vec<Step> {
    let pos = (rank + n - root) % n;
    let step = Step::new(hi - lo).dst(Region::output(lo));
    vec![match pos {
        0 => step.src(Region::input(lo)).send(next(rank, n)),
        p if p == n - 1 => step.recv(prev(rank, n)),
        _ => step.recv(prev(rank, n)).send(next(rank, n)),
    }]
}

/// A chain ending at the root, each rank adding its input on the way.
pub fn reduce(rank: usize, n: usize, root: usize, lo: usize, hi: usize) -> Vec<Step> {
    let pos = (rank + 2 * n - root - 1) % n;
    let step = Step::new(hi - lo).src(Region::input(lo));
    vec![match pos {
        0 => step.send(next(rank, n)),
        p if p == n - 1 => step.recv(prev(rank, n)).dst(Region::output(lo)).finalize(),
        _ => step.recv(prev(rank, n)).send(next(rank, n)),
    }]
}
