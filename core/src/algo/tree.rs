//! Double binary tree all-reduce: the data is reduced up a binary tree to
//! its root and broadcast back down, so each rank talks to at most three
//! others and a collective costs about 2·log2(n) hops instead of the ring's
//! 2·(n-1): NCCL's choice for all-reduce at scale. Two trees split the
//! channels: the second is the first shifted by one position, so that the
//! ranks that are leaves of one tree are inner nodes of the other and
//! every rank carries about the same load.
//!
//! A tree here is over ring positions (`order[p]` is the rank at position
//! `p`), so that ranks of one node, adjacent in the ring, are also close in
//! the tree and most tree edges stay inside a node.

use super::{Region, Step};

/// One rank's place in a tree: its parent and up to two children (ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub parent: Option<usize>,
    pub children: [Option<usize>; 2],
}

/// Position `p`'s place in a balanced binary tree over positions `[lo, hi)`
/// whose root is the middle: the in-order layout, so depth is ceil(log2 n).
fn place(
    p: usize,
    lo: usize,
    hi: usize,
    parent: Option<usize>,
) -> (Option<usize>, [Option<usize>; 2]) {
    let mid = lo + (hi - lo) / 2;
    let child = |a: usize, b: usize| (a < b).then(|| a + (b - a) / 2);
    if p == mid {
        return (parent, [child(lo, mid), child(mid + 1, hi)]);
    }
    if p < mid {
        place(p, lo, mid, Some(mid))
    } else {
        place(p, mid + 1, hi, Some(mid))
    }
}

/// The node of `rank` in tree `which` (0 or 1) over the ring `order`.
pub fn node(rank: usize, order: &[usize], which: usize) -> Node {
    let n = order.len();
    let pos = order
        .iter()
        .position(|&r| r == rank)
        .expect("rank in the ring");
    // Tree 1 is tree 0 shifted by one position: the leaves of the in-order
    // layout fall on alternate positions, so the shift makes them inner
    // nodes (at most one rank is a leaf of both, for any n).
    let map = |q: usize| {
        if which.is_multiple_of(2) {
            q
        } else {
            (q + 1) % n
        }
    };
    let unmap = |p: usize| {
        if which.is_multiple_of(2) {
            p
        } else {
            (p + n - 1) % n
        }
    };
    let q = unmap(pos);
    let (parent, children) = place(q, 0, n, None);
    let rank_at = |q: usize| order[map(q)];
    Node {
        parent: parent.map(rank_at),
        children: children.map(|c| c.map(rank_at)),
    }
}

/// All-reduce of `[lo, hi)` on tree `which`: reduce to the root, then
/// broadcast. Every combine adds a child's partial sum to this rank's, and
/// only the root finalizes, so each input is scaled once and each result
/// finalized once.
pub fn all_reduce(rank: usize, order: &[usize], which: usize, lo: usize, hi: usize) -> Vec<Step> {
    let count = hi - lo;
    let node = node(rank, order, which);
    let kids: Vec<usize> = node.children.iter().flatten().copied().collect();
    let (input, out) = (Region::input(lo), Region::output(lo));
    let mut steps = Vec::with_capacity(4);
    // Up: fold each child's partial sum into this rank's (kept in the
    // output), the last fold going straight on to the parent.
    let mut cur = input;
    for (i, &k) in kids.iter().enumerate() {
        let last = i + 1 == kids.len();
        let s = Step::new(count).recv(k).src(cur);
        steps.push(match (last, node.parent) {
            (true, Some(p)) => s.send(p),
            (true, None) => s.dst(out).finalize(),
            (false, _) => s.dst(out),
        });
        cur = out;
    }
    if kids.is_empty() {
        match node.parent {
            Some(p) => steps.push(Step::new(count).src(input).send(p)),
            None => steps.push(Step::new(count).src(input).dst(out).finalize()),
        }
    }
    // Down: the final value from the parent (or the root's own), passed to
    // each child.
    match node.parent {
        Some(p) => {
            let s = Step::new(count).recv(p).dst(out);
            steps.push(match kids.first() {
                Some(&k) => s.send(k),
                None => s,
            });
            if let Some(&k) = kids.get(1) {
                steps.push(Step::new(count).src(out).send(k));
            }
        }
        None => {
            for &k in &kids {
                steps.push(Step::new(count).src(out).send(k));
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(rank: usize, order: &[usize], which: usize) -> usize {
        let mut d = 0;
        let mut r = rank;
        while let Some(p) = node(r, order, which).parent {
            r = p;
            d += 1;
            assert!(d <= order.len(), "a cycle in tree {which}");
        }
        d
    }

    #[test]
    fn two_trees_span_every_rank_with_log_depth_and_share_the_leaves() {
        for n in 1..=40 {
            let order: Vec<usize> = (0..n).rev().collect();
            for which in 0..2 {
                let roots = (0..n)
                    .filter(|&r| node(r, &order, which).parent.is_none())
                    .count();
                assert_eq!(roots, 1, "n={n} tree {which}");
                let bound = (usize::BITS - n.leading_zeros()) as usize;
                for r in 0..n {
                    assert!(depth(r, &order, which) <= bound, "n={n} rank {r}");
                    // Parent and children agree.
                    for c in node(r, &order, which).children.iter().flatten() {
                        assert_eq!(node(*c, &order, which).parent, Some(r));
                    }
                }
            }
            if n >= 4 {
                // Few ranks are leaves of both trees.
                let leaf = |r, w| node(r, &order, w).children == [None, None];
                let both = (0..n).filter(|&r| leaf(r, 0) && leaf(r, 1)).count();
                assert!(
                    both <= n / 4 + 1,
                    "n={n}: {both} ranks are leaves of both trees"
                );
            }
        }
    }
}
