//! The out-of-band exchange a device communicator is built with: who am I,
//! how many are we, and an all-gather of a few bytes (window addresses, IPC
//! handles). The core's bootstrap provides it between processes; ranks that
//! are threads of one process use [`LocalOob`].

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub trait Oob: Send + Sync {
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// Every rank's `mine`, indexed by rank; all ranks call it in the same order.
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// Ranks that are threads of one process, exchanging through memory.
#[derive(Clone)]
pub struct LocalOob {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    n: usize,
    round: Mutex<Round>,
    cv: Condvar,
    timeout: Duration,
}

#[derive(Default)]
struct Round {
    generation: u64,
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    /// The last completed round; every rank reads it before the next can
    /// complete, since that needs every rank to arrive again.
    done: Arc<Vec<Vec<u8>>>,
}

impl LocalOob {
    /// One handle per rank, to be moved into each rank's thread.
    pub fn group(n: usize) -> Vec<LocalOob> {
        Self::group_with_timeout(n, Duration::from_secs(300))
    }

    /// As [`LocalOob::group`]; a rank waiting longer than `timeout` for the
    /// others gets an error instead of hanging.
    pub fn group_with_timeout(n: usize, timeout: Duration) -> Vec<LocalOob> {
        let shared = Arc::new(Shared {
            n,
            round: Mutex::new(Round {
                slots: vec![None; n],
                ..Round::default()
            }),
            cv: Condvar::new(),
            timeout,
        });
        (0..n)
            .map(|rank| LocalOob {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl Oob for LocalOob {
    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.shared.n
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let s = &self.shared;
        let poisoned = || Error::Internal("local exchange lock poisoned".into());
        let mut r = s.round.lock().map_err(|_| poisoned())?;
        let generation = r.generation;
        r.slots[self.rank] = Some(mine.to_vec());
        r.arrived += 1;
        if r.arrived == s.n {
            let all = r.slots.iter_mut().map(|v| v.take().unwrap_or_default());
            r.done = Arc::new(all.collect());
            r.arrived = 0;
            r.generation += 1;
            s.cv.notify_all();
        } else {
            let deadline = Instant::now() + s.timeout;
            while r.generation == generation {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Remote(format!(
                        "rank {}: the other ranks did not reach the exchange within {:?}",
                        self.rank, s.timeout
                    )));
                }
                r = s.cv.wait_timeout(r, left).map_err(|_| poisoned())?.0;
            }
        }
        Ok(r.done.as_ref().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_gather_every_rank_in_order() {
        let oobs = LocalOob::group(3);
        let out: Vec<Vec<Vec<Vec<u8>>>> = std::thread::scope(|sc| {
            let hs: Vec<_> = oobs
                .iter()
                .map(|o| {
                    sc.spawn(move || {
                        (0..20u8)
                            .map(|k| o.allgather(&[o.rank() as u8, k]).unwrap())
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for per_rank in &out {
            for (k, round) in per_rank.iter().enumerate() {
                assert_eq!(
                    round,
                    &vec![vec![0, k as u8], vec![1, k as u8], vec![2, k as u8]]
                );
            }
        }
    }

    #[test]
    fn a_missing_rank_is_an_error() {
        let oobs = LocalOob::group_with_timeout(2, Duration::from_millis(50));
        assert!(oobs[0].allgather(b"x").is_err());
    }
}
