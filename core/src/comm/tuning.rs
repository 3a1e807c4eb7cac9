//! Whether the ranks' tuner plugins choose alike. Every rank plans each
//! collective on its own, and on the device path the steps carry no header:
//! two ranks that choose different algorithms for one call give wrong
//! results and then a failed launch (as NCCL_ALGO set on one rank did
//! before the rank facts carried it, 94edbd1 on 2026-11-27). NCCL_ALGO
//! and the settings that shape a plan travel with the rank facts
//! ([`super::ident`]); a tuner's choices cannot, so at creation every rank
//! asks its tuner the same questions ([`answers`]) and the ranks compare
//! the replies ([`verdict`]). Unless every rank has a tuner and all reply
//! alike, every rank runs without it.
//!
//! That catches a tuner loaded on some ranks only, one whose `init` failed
//! on some, and one configured differently per rank (another rules file).
//! A tuner whose replies drift apart later (its file edited on one host
//! during the run) is not caught here; on the host path each operation's
//! header still does. The questions are ordinary getCollInfo calls: a
//! tuner that logs its decisions logs these at creation too.

use oxccl_plugin::{Algorithm, Protocol};

use crate::algo::cost::CostTable;
use crate::algo::Coll;
use crate::bootstrap::Bootstrap;
use crate::error::Result;

/// What a tuner made of one question: the cheapest usable cell of the
/// table it returned as (row, protocol), `None` where it left none, and
/// the channel count it returned.
pub type Answer = (Option<(u8, u8)>, i32);

/// The questions: every collective, 8 B to 2 GiB a factor of 4 apart.
pub fn probes() -> Vec<(Coll, usize)> {
    let colls = [
        Coll::AllReduce,
        Coll::Broadcast { root: 0 },
        Coll::Reduce { root: 0 },
        Coll::AllGather,
        Coll::ReduceScatter,
    ];
    colls
        .into_iter()
        .flat_map(|c| (0..15).map(move |k| (c, 8usize << (2 * k))))
        .collect()
}

/// Asks `tune` (a tuner's getCollInfo) every [`probes`] question, each with
/// the table `table` gives for it and one channel.
pub fn answers(
    table: impl Fn(Coll, usize) -> CostTable,
    mut tune: impl FnMut(Coll, usize, &mut CostTable, &mut i32),
) -> Vec<Answer> {
    probes()
        .into_iter()
        .map(|(coll, bytes)| {
            let mut t = table(coll, bytes);
            let mut nch = 1;
            tune(coll, bytes, &mut t, &mut nch);
            (cheapest(&t), nch)
        })
        .collect()
}

fn cheapest(t: &CostTable) -> Option<(u8, u8)> {
    t.iter()
        .enumerate()
        .flat_map(|(r, cells)| cells.iter().enumerate().map(move |(p, c)| (r, p, *c)))
        .filter(|(_, _, c)| *c >= 0.0)
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .map(|(r, p, _)| (r as u8, p as u8))
}

const ANSWER_BYTES: usize = 6;

/// A rank's replies for the others: none without a tuner.
pub fn encode(mine: Option<&[Answer]>) -> Vec<u8> {
    let Some(a) = mine else {
        return vec![0];
    };
    let mut b = vec![1];
    for (cell, nch) in a {
        let (r, p) = cell.unwrap_or((u8::MAX, u8::MAX));
        b.extend_from_slice(&[r, p]);
        b.extend_from_slice(&nch.to_le_bytes());
    }
    b
}

/// `Err` for bytes that are not a reply list of [`probes`]'s length.
fn decode(b: &[u8]) -> std::result::Result<Option<Vec<Answer>>, ()> {
    match b.split_first() {
        Some((0, [])) => Ok(None),
        Some((1, rest)) if rest.len() == probes().len() * ANSWER_BYTES => Ok(Some(
            rest.chunks_exact(ANSWER_BYTES)
                .map(|c| {
                    let cell = (c[0] != u8::MAX).then_some((c[0], c[1]));
                    (cell, i32::from_le_bytes([c[2], c[3], c[4], c[5]]))
                })
                .collect(),
        )),
        _ => Err(()),
    }
}

fn describe((cell, nch): Answer) -> String {
    let cell = match cell {
        Some((r, p)) => format!(
            "{}/{}",
            Algorithm::from_index(r.into()).map_or("?", Algorithm::name),
            Protocol::from_index(p.into()).map_or("?", Protocol::name)
        ),
        None => "no usable entry".into(),
    };
    format!("{cell} on {nch} channel(s)")
}

/// Why the ranks' tuners cannot be followed, from every rank's
/// [`encode`]d replies; `None` when every rank has one and all replied
/// alike, or none has one.
pub fn verdict(all: &[Vec<u8>]) -> Option<String> {
    let mut replies = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        match decode(b) {
            Ok(a) => replies.push(a),
            Err(()) => return Some(format!("rank {r} sent malformed tuner replies")),
        }
    }
    let (with, without): (Vec<usize>, Vec<usize>) =
        (0..replies.len()).partition(|r| replies[*r].is_some());
    if with.is_empty() {
        return None;
    }
    if !without.is_empty() {
        return Some(format!(
            "ranks {with:?} have a tuner plugin and ranks {without:?} none (not found, refused, or its init failed there)"
        ));
    }
    let first = replies[0].as_deref().expect("every rank has replies");
    for (r, a) in replies.iter().enumerate().skip(1) {
        let a = a.as_deref().expect("every rank has replies");
        if let Some(((coll, bytes), (i, mine))) = probes()
            .into_iter()
            .zip(a.iter().enumerate())
            .find(|(_, (i, x))| **x != first[*i])
        {
            return Some(format!(
                "rank {r}'s tuner chooses {} for {} of {bytes} B, rank 0's {}",
                describe(*mine),
                coll.name(),
                describe(first[i])
            ));
        }
    }
    None
}

/// One allgather of every rank's replies (`mine`: none without a tuner);
/// the [`verdict`], alike on every rank.
pub fn agree(bootstrap: &Bootstrap, mine: Option<&[Answer]>) -> Result<Option<String>> {
    Ok(verdict(&bootstrap.allgather(&encode(mine))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::cost::{cost_table, Fabric, LinkModel};

    fn table(coll: Coll, bytes: usize) -> CostTable {
        let f = Fabric {
            intra: LinkModel::SHM,
            inter: LinkModel::SHM,
            nodes: 1,
        };
        cost_table(coll, bytes, 4, f, None)
    }

    /// A tuner that makes ring/simple cheapest from `from` bytes on and
    /// asks for `nch` channels.
    fn ring_from(from: usize, nch: i32) -> impl FnMut(Coll, usize, &mut CostTable, &mut i32) {
        move |_, bytes, t, n| {
            if bytes >= from {
                t[1][2] = 0.0;
                *n = nch;
            }
        }
    }

    fn replies(from: usize, nch: i32) -> Vec<u8> {
        encode(Some(&answers(table, ring_from(from, nch))))
    }

    #[test]
    fn ranks_whose_tuners_reply_alike_keep_them() {
        let a = replies(1 << 20, 4);
        assert_eq!(verdict(&[a.clone(), a.clone(), a]), None);
        assert_eq!(verdict(&[encode(None), encode(None)]), None);
    }

    #[test]
    fn a_tuner_on_some_ranks_only_is_named() {
        let why = verdict(&[encode(None), replies(0, 2), encode(None)]).unwrap();
        assert!(
            why.contains("ranks [1] have a tuner plugin and ranks [0, 2] none"),
            "{why}"
        );
    }

    #[test]
    fn the_first_question_answered_apart_is_named_with_both_replies() {
        let why = verdict(&[
            replies(1 << 20, 4),
            replies(1 << 20, 4),
            replies(1 << 20, 2),
        ])
        .unwrap();
        assert!(
            why.starts_with("rank 2's tuner chooses ring/simple on 2 channel(s) for all_reduce of 2097152 B, rank 0's ring/simple on 4 channel(s)"),
            "{why}"
        );
        let why = verdict(&[replies(1 << 20, 4), replies(1 << 10, 4)]).unwrap();
        assert!(why.contains("for all_reduce of 2048 B, rank 0's"), "{why}");
        assert!(
            why.starts_with("rank 1's tuner chooses ring/simple on 4"),
            "{why}"
        );
    }

    #[test]
    fn malformed_replies_are_named() {
        let mut b = replies(0, 1);
        b.pop();
        assert_eq!(
            verdict(&[replies(0, 1), b]).as_deref(),
            Some("rank 1 sent malformed tuner replies")
        );
        assert!(verdict(&[vec![7]]).is_some());
    }

    #[test]
    fn replies_survive_their_bytes() {
        let a = answers(table, ring_from(1 << 10, 3));
        assert_eq!(a.len(), probes().len());
        assert_eq!(decode(&encode(Some(&a))), Ok(Some(a)));
        assert_eq!(decode(&encode(None)), Ok(None));
        let none = vec![(None, 1); probes().len()];
        assert_eq!(decode(&encode(Some(&none))), Ok(Some(none)));
    }
}
