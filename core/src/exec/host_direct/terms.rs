//! The terms of the direct host path: what every rank must set alike
//! (which calls take the path, how an all-reduce is sliced; all take rank
//! 0's, [`Terms`]) and what each rank may set for itself (the threads a
//! call runs on, whether reads stream through scratch), from the
//! `OXCCL_HOST_DIRECT_*` settings and the host's last-level cache.

use std::sync::OnceLock;

use super::CHUNK;
use crate::config::ox;
use crate::error::Result;
use crate::transport::cma::INLINE;

/// What every rank's direct path must set alike: which calls take it (a
/// rank on the rings and one here would wait for each other until
/// NCCL_TIMEOUT) and how an all-reduce is sliced (ranks that cut their
/// parts differently would read each other's slices before they are
/// written, and finish with wrong results and no error). Each rank reads
/// them from its own environment; all take rank 0's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The smallest collective that takes the path.
    pub min: usize,
    /// The same for broadcast and reduce, whose chains beat the direct
    /// path below 512 KiB even with fewer cores than ranks.
    pub rooted_min: usize,
    /// The largest message sent on this path; larger ones take the rings.
    pub p2p_max: usize,
    /// How an all-reduce cuts its parts, see [`Slice::for_call`].
    pub slice: Slice,
}

/// Bytes of [`Terms::encode`].
pub const TERMS_BYTES: usize = 40;

impl Terms {
    /// This rank's, for `n` ranks, and the threads it runs a call on
    /// (each rank's own).
    pub fn from_env(n: usize) -> Result<(Terms, Threads)> {
        let (min, rooted_min, threads) = settings(n)?;
        let terms = Terms {
            min,
            rooted_min,
            p2p_max: p2p_max(threads)?,
            slice: Slice::from_env()?,
        };
        Ok((terms, threads))
    }

    pub fn encode(&self) -> [u8; TERMS_BYTES] {
        let (tag, slice) = match self.slice {
            Slice::Fixed(s) => (0u64, s),
            Slice::Auto { cache } => (1, cache),
        };
        let words = [self.min, self.rooted_min, self.p2p_max]
            .map(|v| v as u64)
            .into_iter()
            .chain([tag, slice as u64]);
        let mut b = [0u8; TERMS_BYTES];
        for (i, w) in words.enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Option<Terms> {
        let w = |i: usize| -> Option<usize> {
            Some(u64::from_le_bytes(b.get(8 * i..8 * i + 8)?.try_into().ok()?) as usize)
        };
        let slice = match (w(3)?, w(4)?) {
            (0, s) => Slice::Fixed(s),
            (1, cache) => Slice::Auto { cache },
            _ => return None,
        };
        (b.len() == TERMS_BYTES).then_some(Terms {
            min: w(0)?,
            rooted_min: w(1)?,
            p2p_max: w(2)?,
            slice,
        })
    }

    /// Where `self` (this rank's) differs from `first` (rank 0's), each
    /// difference as the variable that sets it and both values.
    pub fn differences(&self, first: &Terms) -> Vec<String> {
        let slice = |s: Slice| match s {
            Slice::Fixed(b) => b.to_string(),
            Slice::Auto { cache } => format!("unset (last-level cache {cache} bytes)"),
        };
        [
            ("OXCCL_HOST_DIRECT_MIN", self.min, first.min),
            (
                "OXCCL_HOST_DIRECT_MIN (broadcast, reduce)",
                self.rooted_min,
                first.rooted_min,
            ),
            ("OXCCL_HOST_DIRECT_P2P_MAX", self.p2p_max, first.p2p_max),
        ]
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(var, a, b)| format!("{var}: {a} here, {b} on rank 0"))
        .chain((self.slice != first.slice).then(|| {
            format!(
                "OXCCL_HOST_DIRECT_SLICE: {} here, {} on rank 0",
                slice(self.slice),
                slice(first.slice)
            )
        }))
        .collect()
    }
}

/// How an all-reduce cuts its parts into slices ([`crate::algo::pull::slices`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    /// `OXCCL_HOST_DIRECT_SLICE`: these bytes per slice, 0 for whole parts.
    Fixed(usize),
    /// [`SLICE`]-byte slices once the ranks' inputs outgrow the host's
    /// last-level cache (`cache` bytes) four times over, whole parts below.
    Auto { cache: usize },
}

impl Slice {
    /// From `OXCCL_HOST_DIRECT_SLICE`, else by the size of the cache. A
    /// smaller slice than one reduction chunk is raised to it: each slice
    /// costs an announcement and the waits for it.
    pub(super) fn from_env() -> Result<Slice> {
        Ok(ox::host_direct_slice()?.map_or(
            Slice::Auto {
                cache: last_level_cache(),
            },
            |v| match usize::try_from(v).unwrap_or(usize::MAX) {
                0 => Slice::Fixed(0),
                v => Slice::Fixed(v.max(CHUNK)),
            },
        ))
    }

    /// Bytes per slice of a call moving `bytes` per rank on `n` ranks (0:
    /// whole parts). Every rank of a host comes to the same answer, which
    /// the plans' phases rely on.
    pub fn for_call(self, n: usize, bytes: usize) -> usize {
        match self {
            Slice::Fixed(s) => s,
            Slice::Auto { cache } if n.saturating_mul(bytes) > cache.saturating_mul(4) => SLICE,
            Slice::Auto { .. } => 0,
        }
    }
}

/// 1 MiB. Once the ranks' buffers outgrow the cache, pulling whole parts
/// reads them back from memory, and 8 ranks on the 16-core H200 host
/// (300 MiB of L3) are bound by its memory bandwidth (16 threads copy
/// 78.6 GB/s of traffic there). 8 ranks at 256 MiB, busbw in 1 MiB slices
/// against whole parts, three alternating rounds: 6.58/6.36, 5.94/5.78,
/// 6.05/6.26 against 5.63/5.70, 5.25/6.07, 5.41/6.01 GB/s. Where the
/// buffers still fit, slices only add phases: 4 ranks at 16 MiB, 14.8/16.3
/// and 16.8/18.6 against 20.3/20.2. Inputs of 1.7-3.4 times the cache
/// (64 MiB on 8 ranks, 256 MiB on 4 there; 64 MiB on 2 ranks on a 2-core
/// VM with 32 MiB) were within noise, at 6.8 times (8 x 256 MiB) slices
/// gain; hence four times (2026-11-27, f567255).
pub const SLICE: usize = 1 << 20;

/// Whether a call's reads of a chunk or more go through the thread's
/// scratch and [`mem::copy_streaming`] instead of straight into the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `OXCCL_HOST_DIRECT_STREAM`: 1 always, 0 never.
    Fixed(bool),
    /// Once the ranks' buffers outgrow half the host's last-level cache
    /// (`cache` bytes), on 4 ranks or more copying on 8 threads or more.
    Auto { cache: usize },
}

impl Stream {
    pub(super) fn from_env() -> Result<Stream> {
        Ok(match ox::host_direct_stream()? {
            Some(on) => Stream::Fixed(on),
            None => Stream::Auto {
                cache: last_level_cache(),
            },
        })
    }

    /// For a call whose buffers span `bytes` per rank (input and output, or
    /// one of them where they overlap), on `n` ranks of `threads` threads
    /// each. The kernel's copy reads a fresh destination for ownership
    /// before writing it; streaming stores do not, at the price of a
    /// second pass from scratch. On the 16-core H200 host (300 MiB of L3;
    /// busbw out of place, alternating rounds in three calls) that gains
    /// once the buffers leave the cache: 8 ranks, all_reduce 256 MiB
    /// 6.22-7.80 against 5.64-6.38, all_gather 64 MiB 7.40-8.01 against
    /// 5.48-6.07; 4 ranks, all_gather 64 MiB 11.61-11.62 against 8.91-9.52.
    /// Where they fit it loses: 8 ranks, all_gather 16 MiB (144 MiB of
    /// buffers in all) 6.62-8.18 against 8.95-10.26, all_reduce 16 MiB in
    /// place (128 MiB) 6.27-6.88 against 7.39-8.31, while out of place (256
    /// MiB) it gained, 6.14-7.33 against 5.78-6.90; hence half the cache.
    /// It lost for 2 ranks there (all_reduce 256 MiB 11.31/13.50 against
    /// 12.96/17.65, one round) and with few threads, where the copy binds
    /// rather than memory (a 2-core VM's 2 ranks lost a fifth to a half at
    /// 64 and 256 MiB); measured 2026-11-27, 728d081 and 55d985c.
    pub fn for_call(self, n: usize, bytes: usize, threads: usize) -> bool {
        match self {
            Stream::Fixed(on) => on,
            Stream::Auto { cache } => {
                n >= 4 && n * threads >= 8 && n.saturating_mul(bytes) > cache / 2
            }
        }
    }
}

/// Bytes of the host's largest CPU cache as Linux describes cpu0's
/// (`/sys/devices/system/cpu/cpu0/cache`); 32 MiB where it says nothing.
/// Read once per process: every communicator's direct path asks twice.
fn last_level_cache() -> usize {
    static CACHE: OnceLock<usize> = OnceLock::new();
    *CACHE.get_or_init(|| {
        let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let level: u32 = read(e.path().join("level"))?.trim().parse().ok()?;
                let size = crate::config::parse_size(&read(e.path().join("size"))?)?;
                Some((level, size as usize))
            })
            .max()
            .map_or(32 << 20, |(_, size)| size)
    })
}

/// The largest point-to-point message the direct path carries
/// (`OXCCL_HOST_DIRECT_P2P_MAX`). By default every message where a rank
/// has two threads or more to copy with: split over them, the kernel's
/// copy beats the rings at every size (16-core H100 host, 256 MiB
/// sendrecv: 11.9 / 6.4 / 3.9 GB/s against the rings' 3.3 / 2.6 / 2.4 on
/// 2 / 4 / 8 ranks). With one thread, up to 1 MiB: beyond it the rings'
/// two user-space copies, pipelined on two cores, are as fast or faster
/// (2-core VM, 2 ranks: 15.3 against 3.9 GB/s at 256 KiB, 9.5 against
/// 13.7 at 8 MiB).
fn p2p_max(threads: Threads) -> Result<usize> {
    let default = if threads.most() >= 2 {
        usize::MAX
    } else {
        1 << 20
    };
    Ok(ox::host_direct_p2p_max()?.map_or(default, |v| usize::try_from(v).unwrap_or(usize::MAX)))
}

/// Bytes a thread is worth: below this, starting it costs more than it saves.
const PER_THREAD: usize = 512 << 10;

/// How many threads a rank runs a call on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// `OXCCL_HOST_DIRECT_THREADS`: always this many.
    Fixed(usize),
    /// At most this many (this host's cores shared among its ranks, at
    /// most 8), fewer for small calls.
    Auto(usize),
}

/// The direct path's settings for `n` ranks on this host: the smallest
/// collective it takes (`OXCCL_HOST_DIRECT_MIN` bytes) and its threads per
/// rank. The default minimum is 512 KiB where every rank has a core: below
/// it the rings' pipelined hand-offs beat the meetings and a system call
/// per chunk and peer (on 16 cores the two cross between 128 KiB and 1 MiB
/// for 4 to 8 ranks; on 2 cores with 2 ranks, 32 KiB all_reduce 3.1-5.1 us
/// on the rings against 6.7-8.0 direct). Where the host has fewer cores
/// than ranks, every ring hand-off waits for a context switch, so the
/// direct path takes everything above the inline size (4 ranks on 2
/// cores, all_reduce out of place: 8 KiB 39-72 us against 68-158 on the
/// rings, 32 KiB 45-62 against 83-408, 128 KiB 80-172 against 360-446;
/// all_gather and reduce_scatter alike). Broadcast and reduce keep 512
/// KiB there: their chains were as fast or faster at 8-128 KiB (broadcast
/// 8 KiB 17-30 us against 17-70, reduce 27-33 against 40-94). The second
/// value is broadcast's and reduce's minimum; `OXCCL_HOST_DIRECT_MIN` sets
/// both.
pub fn settings(n: usize) -> Result<(usize, usize, Threads)> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let least = if n > cores { INLINE + 1 } else { 512 << 10 };
    let set = ox::host_direct_min()?.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
    let (min, rooted_min) = (set.unwrap_or(least), set.unwrap_or(512 << 10));
    // 1 to 256: checked where declared.
    let threads = ox::host_direct_threads()?
        .map_or(Threads::Auto((cores / n.max(1)).clamp(1, 8)), |t| {
            Threads::Fixed(t as usize)
        });
    Ok((min, rooted_min, threads))
}

impl Threads {
    /// Threads for a call moving `bytes`.
    pub fn for_bytes(self, bytes: usize) -> usize {
        match self {
            Threads::Fixed(t) => t,
            Threads::Auto(most) => most.min(bytes.div_ceil(PER_THREAD)).max(1),
        }
    }

    pub fn most(self) -> usize {
        match self {
            Threads::Fixed(t) | Threads::Auto(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_survive_their_bytes_and_name_what_differs() {
        let a = Terms {
            min: 1,
            rooted_min: 512 << 10,
            p2p_max: usize::MAX,
            slice: Slice::Auto { cache: 300 << 20 },
        };
        let b = Terms {
            min: 1 << 30,
            slice: Slice::Fixed(0),
            ..a
        };
        for t in [a, b] {
            assert_eq!(Terms::decode(&t.encode()), Some(t));
        }
        assert_eq!(Terms::decode(&a.encode()[..39]), None);
        assert!(a.differences(&a).is_empty());
        let d = b.differences(&a);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("OXCCL_HOST_DIRECT_MIN: 1073741824 here, 1 on rank 0"));
        assert!(d[1].contains("OXCCL_HOST_DIRECT_SLICE: 0 here, unset (last-level cache"));
    }

    #[test]
    fn slices_start_where_the_inputs_outgrow_the_cache_four_times_over() {
        let auto = Slice::Auto { cache: 300 << 20 };
        // 8 ranks: 64 MiB (512 MiB of inputs) stays whole, 256 MiB is sliced.
        assert_eq!(auto.for_call(8, 64 << 20), 0);
        assert_eq!(auto.for_call(8, 256 << 20), SLICE);
        // 4 ranks at 256 MiB (1 GiB of inputs) stays whole too.
        assert_eq!(auto.for_call(4, 256 << 20), 0);
        // 4 ranks at 16 MiB, where slices only added phases.
        assert_eq!(auto.for_call(4, 16 << 20), 0);
        assert_eq!(Slice::Fixed(0).for_call(8, 1 << 30), 0);
        assert_eq!(Slice::Fixed(4 << 20).for_call(2, 8), 4 << 20);
        assert_eq!(auto.for_call(usize::MAX, usize::MAX), SLICE);
        assert!(last_level_cache() >= 64 << 10);
    }

    #[test]
    fn streaming_stores_start_past_the_cache_on_four_ranks_and_eight_threads() {
        let auto = Stream::Auto { cache: 300 << 20 };
        // 8 ranks x 2 threads: all_reduce of 16 MiB streams out of place (input
        // and output, 256 MiB in all), not in place (128 MiB); an all_gather
        // of 16 MiB (2 MiB inputs) does not either way.
        assert!(auto.for_call(8, 32 << 20, 2));
        assert!(!auto.for_call(8, 16 << 20, 2));
        assert!(!auto.for_call(8, 18 << 20, 2));
        assert!(auto.for_call(8, 64 << 20, 2));
        // 2 ranks: never, with one thread each (a 2-core host) or eight.
        assert!(!Stream::Auto { cache: 32 << 20 }.for_call(2, 256 << 20, 1));
        assert!(!auto.for_call(2, 1 << 30, 8));
        // 4 ranks of one thread each (a 4-core host): the copy binds.
        assert!(!Stream::Auto { cache: 32 << 20 }.for_call(4, 256 << 20, 1));
        assert!(auto.for_call(4, 256 << 20, 4));
        assert!(Stream::Fixed(true).for_call(2, 8, 1));
        assert!(!Stream::Fixed(false).for_call(8, 1 << 30, 8));
    }
}
