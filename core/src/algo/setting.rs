//! NCCL_ALGO as NCCL 2.24+ reads it: `[func:]list` entries separated by
//! `;` (the first may name no function and then covers every function not
//! named later), each list comma-separated algorithm names, all of them
//! excluded instead when it starts with `^`. Names are NCCL's (Ring, Tree,
//! Collnet, CollnetChain, CollnetDirect, NVLS, NVLSTree, PAT) and oxccl's
//! RecDoubling (RD); an unknown token is an error, as in NCCL.
//!
//! oxccl holds a communicator to one algorithm at most, or leaves some
//! out (its rows: Ring, Tree, which admits both tree-shaped all-reduces,
//! and PAT). A setting that leaves every row oxccl has for every
//! collective (`^NVLS`, a list of what oxccl lacks excluded) holds
//! nothing; one that leaves a single row holds the communicator to it;
//! one that takes the same rows from every collective that has them
//! (`^PAT`, `allreduce:^tree`) leaves those out; any other (a row kept for
//! some collectives and not others) is named in a WARN and holds nothing.
//! Where a setting leaves a collective nothing oxccl has (`^ring` for a
//! broadcast), the ring runs it.

use super::cost::Held;
use super::Algo;

/// NCCL's algorithm names, lower case, and the oxccl row each runs on.
const NAMES: &[(&str, Option<Algo>)] = &[
    ("ring", Some(Algo::Ring)),
    ("tree", Some(Algo::Tree)),
    ("pat", Some(Algo::Pat)),
    ("collnet", None),
    ("collnetchain", None),
    ("collnetdirect", None),
    ("nvls", None),
    ("nvlstree", None),
    ("recdoubling", Some(Algo::RecDoubling)),
    ("rd", Some(Algo::RecDoubling)),
];

/// NCCL's function names as NCCL_ALGO takes them, lower case.
const FUNCS: &[&str] = &[
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
];

/// Which oxccl rows run each function (in [`FUNCS`]'s order).
fn rows_of(func: usize) -> &'static [Algo] {
    match FUNCS[func] {
        "allreduce" => &[Algo::Ring, Algo::Tree, Algo::RecDoubling],
        "allgather" | "reducescatter" => &[Algo::Ring, Algo::Pat],
        _ => &[Algo::Ring],
    }
}

/// What a communicator takes from NCCL_ALGO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgoSetting {
    /// The one algorithm the communicator is held to, if any.
    pub forced: Option<Algo>,
    /// The algorithms left out for every collective (nothing forced).
    pub excluded: Vec<Algo>,
    /// Why part of the setting is not honoured (for a WARN), if so.
    pub unhonoured: Option<String>,
    /// NCCL's algorithms the setting excludes that oxccl has none of.
    pub lacked: Vec<&'static str>,
}

fn name_of(tok: &str) -> Result<usize, String> {
    NAMES
        .iter()
        .position(|(n, _)| n.eq_ignore_ascii_case(tok))
        .ok_or_else(|| {
            format!(
                "{tok:?} is no algorithm: expected Ring, Tree, PAT, Collnet, CollnetChain, CollnetDirect, NVLS, NVLSTree or RecDoubling, comma-separated, ^ first to exclude, `func:` before a list for one function"
            )
        })
}

fn idx(name: &str) -> usize {
    NAMES
        .iter()
        .position(|(n, _)| *n == name)
        .expect("a name of the table")
}

/// The names (indices into [`NAMES`]) a list allows.
fn list(s: &str) -> Result<Vec<bool>, String> {
    let (neg, body) = match s.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s.trim()),
    };
    let mut on = vec![false; NAMES.len()];
    let mut any = false;
    for tok in body.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        on[name_of(tok)?] = true;
        any = true;
    }
    if !any {
        return Err(format!("{s:?} names no algorithm"));
    }
    if neg {
        let own = |on: &[bool]| on[idx("rd")] || on[idx("recdoubling")];
        let rd_named = own(&on);
        on.iter_mut().for_each(|b| *b = !*b);
        // oxccl's own name follows NCCL's Tree row in an exclusion that
        // does not name it: `^tree` means no tree-shaped all-reduce.
        if !rd_named {
            let tree = on[idx("tree")];
            on[idx("rd")] = tree;
            on[idx("recdoubling")] = tree;
        }
    }
    Ok(on)
}

impl AlgoSetting {
    /// What the cost model takes from the setting.
    pub fn held(&self) -> Held {
        match self.forced {
            Some(_) => Held::from(self.forced),
            None => Held::excluding(&self.excluded),
        }
    }
}

/// Parses NCCL_ALGO's value.
pub fn parse(s: &str) -> Result<AlgoSetting, String> {
    // Every function starts with every algorithm allowed.
    let mut allowed = vec![vec![true; NAMES.len()]; FUNCS.len()];
    let entries: Vec<&str> = s
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Err("names no algorithm".into());
    }
    for (i, entry) in entries.iter().enumerate() {
        match entry.split_once(':') {
            Some((func, l)) => {
                let f = FUNCS
                    .iter()
                    .position(|x| x.eq_ignore_ascii_case(func.trim()))
                    .ok_or_else(|| {
                        format!(
                            "{:?} is no function: expected Broadcast, Reduce, AllGather, ReduceScatter or AllReduce",
                            func.trim()
                        )
                    })?;
                allowed[f] = list(l)?;
            }
            None if i == 0 => {
                let l = list(entry)?;
                // The first entry covers the functions not named later.
                for (f, a) in allowed.iter_mut().enumerate() {
                    let later = entries[1..].iter().any(|e| {
                        e.split_once(':')
                            .is_some_and(|(x, _)| x.trim().eq_ignore_ascii_case(FUNCS[f]))
                    });
                    if !later {
                        *a = l.clone();
                    }
                }
            }
            None => return Err(format!("entry {entry:?} after the first names no function")),
        }
    }
    let lacked: Vec<&'static str> = NAMES
        .iter()
        .enumerate()
        .filter(|(i, (_, ours))| ours.is_none() && allowed.iter().any(|a| !a[*i]))
        .map(|(_, (n, _))| *n)
        .filter(|n| *n != "collnet")
        .collect();
    // The rows each function keeps.
    let kept: Vec<Vec<Algo>> = (0..FUNCS.len())
        .map(|f| {
            rows_of(f)
                .iter()
                .copied()
                .filter(|&r| {
                    NAMES
                        .iter()
                        .enumerate()
                        .any(|(i, (_, ours))| *ours == Some(r) && allowed[f][i])
                        // Tree admits both tree-shaped all-reduces.
                        || (r == Algo::RecDoubling
                            && NAMES
                                .iter()
                                .enumerate()
                                .any(|(i, (_, o))| *o == Some(Algo::Tree) && allowed[f][i]))
                })
                .collect()
        })
        .collect();
    let everything = (0..FUNCS.len()).all(|f| kept[f].len() == rows_of(f).len());
    if everything {
        return Ok(AlgoSetting {
            forced: None,
            excluded: Vec::new(),
            unhonoured: None,
            lacked,
        });
    }
    // One row named for every function that has it: held to it.
    let mut union: Vec<Algo> = kept.iter().flatten().copied().collect();
    union.sort_by_key(|a| a.code());
    union.dedup();
    let tree_only = union
        .iter()
        .all(|a| matches!(a, Algo::Tree | Algo::RecDoubling));
    let single = match union.as_slice() {
        [one] => Some(*one),
        _ if tree_only && !union.is_empty() => Some(Algo::Tree),
        _ => None,
    };
    if let Some(r) = single {
        let uniform = (0..FUNCS.len()).all(|f| {
            let want: Vec<Algo> = rows_of(f)
                .iter()
                .copied()
                .filter(|&x| x == r || (r == Algo::Tree && x == Algo::RecDoubling))
                .collect();
            kept[f].is_empty() || kept[f] == want || want.is_empty()
        });
        if uniform {
            return Ok(AlgoSetting {
                forced: Some(r),
                excluded: Vec::new(),
                unhonoured: None,
                lacked,
            });
        }
    }
    // The same rows taken from every function that has them: left out.
    let mut out: Vec<Algo> = (0..FUNCS.len())
        .flat_map(|f| {
            let kept = &kept[f];
            rows_of(f)
                .iter()
                .copied()
                .filter(move |r| !kept.contains(r))
        })
        .collect();
    out.sort_by_key(|a| a.code());
    out.dedup();
    let common = (0..FUNCS.len()).all(|f| {
        let want: Vec<Algo> = rows_of(f)
            .iter()
            .copied()
            .filter(|r| !out.contains(r))
            .collect();
        kept[f] == want
    });
    if common {
        return Ok(AlgoSetting {
            forced: None,
            excluded: out,
            unhonoured: None,
            lacked,
        });
    }
    Ok(AlgoSetting {
        forced: None,
        excluded: Vec::new(),
        unhonoured: Some(
            "it keeps different algorithms for different collectives, and oxccl holds a communicator to one algorithm at most: it chooses among all of its own".into(),
        ),
        lacked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forced(s: &str) -> Option<Algo> {
        parse(s).unwrap().forced
    }

    #[test]
    fn one_algorithm_holds_the_communicator() {
        assert_eq!(forced("Ring"), Some(Algo::Ring));
        assert_eq!(forced("ring"), Some(Algo::Ring));
        assert_eq!(forced("tree"), Some(Algo::Tree));
        assert_eq!(forced("PAT"), Some(Algo::Pat));
        assert_eq!(forced("rd"), Some(Algo::RecDoubling));
        assert_eq!(forced("ring,nvls"), Some(Algo::Ring));
        assert_eq!(forced("^tree,pat"), Some(Algo::Ring));
    }

    #[test]
    fn excluding_what_oxccl_lacks_holds_nothing() {
        for s in [
            "^NVLS",
            "^nvls,nvlstree",
            "^CollnetDirect,CollnetChain",
            "ring,tree,pat",
        ] {
            let a = parse(s).unwrap();
            assert_eq!((a.forced, a.unhonoured.is_some()), (None, false), "{s}");
        }
        assert_eq!(parse("^NVLS").unwrap().lacked, vec!["nvls"]);
    }

    #[test]
    fn per_function_settings_as_nccl_writes_them() {
        // NCCL's own examples.
        let a = parse("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring").unwrap();
        assert_eq!(a.forced, None);
        assert!(a.unhonoured.is_some());
        // The tree only runs all-reduces: left out, as asked.
        let a = parse("allreduce:^tree").unwrap();
        assert_eq!((a.forced, a.unhonoured.is_some()), (None, false));
        assert_eq!(a.excluded, vec![Algo::RecDoubling, Algo::Tree]);
        // PAT kept for one of its two collectives: not honoured.
        let a = parse("allgather:^pat").unwrap();
        assert_eq!((a.forced, a.excluded.len()), (None, 0));
        assert!(a.unhonoured.is_some());
        // Every function named for the ring: held to it.
        assert_eq!(
            forced("ring;allreduce:ring;allgather:ring"),
            Some(Algo::Ring)
        );
    }

    /// `^PAT` leaves PAT out of every collective and holds nothing else;
    /// so does naming it for both of its collectives.
    #[test]
    fn excluding_pat_leaves_the_rest() {
        for s in ["^PAT", "^pat,nvls", "allgather:^pat;reducescatter:ring"] {
            let a = parse(s).unwrap();
            assert_eq!(
                (a.forced, a.excluded.clone(), a.unhonoured.is_some()),
                (None, vec![Algo::Pat], false),
                "{s}"
            );
            assert!(a.held().excludes(Algo::Pat) && !a.held().excludes(Algo::Ring));
        }
        // Forcing PAT holds it (where it runs).
        assert_eq!(parse("PAT").unwrap().held().forced, Some(Algo::Pat));
        // `^ring`: every other row; broadcasts keep the ring regardless.
        let a = parse("^ring").unwrap();
        assert_eq!(a.excluded, vec![Algo::Ring]);
    }

    #[test]
    fn unknown_tokens_are_refused() {
        for s in [
            "",
            "^",
            "ring;tree",
            "bogus",
            "allreduce:",
            "scatter:ring",
            "ring,,x",
        ] {
            assert!(parse(s).is_err(), "{s:?}");
        }
    }
}
