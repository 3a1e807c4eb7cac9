//! From a schedule of `crate::algo` to what the kernel runs: the steps
//! abstracted over the channel's range, and the launch's shape.
//!
//! A rank's schedule for a range `[lo, hi)` addresses, in every step, either
//! the whole range or chunk `j` of `n` equal chunks of it, at `block * count`
//! in a buffer. The template keeps exactly that (buffer, block, chunk), so
//! one copy of it serves every channel, each channel expanding it over its
//! own range on the GPU. The template is read off the host schedule and then
//! checked against it on uneven ranges, so the two cannot drift apart.

use oxccl_kernels::MAX_STEPS;

use super::config::DeviceConfig;
use crate::algo::{self, Algo, Buf, Coll, Region, Step};
use crate::cuda::abi::{
    runs_on_channel, DevStep, BUF_INPUT, BUF_NONE, BUF_OUTPUT, CHUNK_WHOLE, STEP_EVEN_CH,
    STEP_FINALIZE, STEP_ODD_CH, STEP_SEND_LOCAL,
};
use crate::error::{Error, Result};

/// A rank's steps in device form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Template {
    pub steps: [DevStep; MAX_STEPS],
    pub nsteps: u32,
    /// How many chunks the chunked steps split a channel's range into.
    pub nchunks: u32,
}

impl Template {
    fn new(steps: &[DevStep], nchunks: u32) -> Result<Template> {
        if steps.len() > MAX_STEPS {
            return Err(Error::InvalidUsage(format!(
                "the schedule has {} steps; the device kernel takes at most {MAX_STEPS}",
                steps.len()
            )));
        }
        let mut t = Template {
            steps: [DevStep::default(); MAX_STEPS],
            nsteps: steps.len() as u32,
            nchunks,
        };
        t.steps[..steps.len()].copy_from_slice(steps);
        Ok(t)
    }

    /// Steps that each move a whole channel range (point-to-point groups).
    pub fn from_steps(steps: &[DevStep]) -> Result<Template> {
        Template::new(steps, 1)
    }

    /// Sending `count` elements of the input to `peer`.
    pub fn send(peer: usize) -> Template {
        let s = DevStep {
            recv: -1,
            send: peer as i16,
            src_buf: BUF_INPUT,
            chunk: CHUNK_WHOLE,
            ..DevStep::default()
        };
        Template::new(&[s], 1).expect("one step fits")
    }

    /// Receiving `count` elements from `peer` into the output.
    pub fn recv(peer: usize) -> Template {
        let s = DevStep {
            recv: peer as i16,
            send: -1,
            dst_buf: BUF_OUTPUT,
            chunk: CHUNK_WHOLE,
            ..DevStep::default()
        };
        Template::new(&[s], 1).expect("one step fits")
    }

    /// The steps the host would run for `[lo, hi)` on channel `ch`, split
    /// as `algo` splits.
    fn expand(&self, count: usize, lo: usize, hi: usize, ch: usize) -> Vec<Step> {
        self.steps[..self.nsteps as usize]
            .iter()
            .filter(|d| runs_on_channel(d.flags, ch))
            .map(|d| {
                let (a, b) = if d.chunk == CHUNK_WHOLE {
                    (lo, hi)
                } else {
                    algo::split(lo, hi, self.nchunks as usize, d.chunk as usize)
                };
                let region = |buf: u8, block: u16| {
                    let offset = block as usize * count + a;
                    match buf {
                        BUF_INPUT => Some(Region::input(offset)),
                        BUF_OUTPUT => Some(Region::output(offset)),
                        _ => None,
                    }
                };
                Step {
                    count: b - a,
                    recv: (d.recv >= 0).then_some(d.recv as usize),
                    send: (d.send >= 0).then_some(d.send as usize),
                    src: region(d.src_buf, d.src_block),
                    dst: region(d.dst_buf, d.dst_block),
                    send_local: d.flags & STEP_SEND_LOCAL != 0,
                    finalize: d.flags & STEP_FINALIZE != 0,
                }
            })
            .collect()
    }
}

/// The device form of `rank`'s schedule of `coll` among `n` ranks. The
/// tree's two trees (channels of each parity, as on the host) go in one
/// template, each step marked with the channels that run it.
pub(crate) fn template(algo: Algo, coll: Coll, rank: usize, n: usize) -> Result<Template> {
    let order: Vec<usize> = (0..n).collect();
    let schedule = |ch: usize, count: usize, lo: usize, hi: usize| {
        algo::schedule_on(algo, coll, rank, &order, ch, count, lo, hi, 0)
    };
    let unfit = |why: String| {
        Error::Internal(format!(
            "{} on {n} ranks (rank {rank}, {}) does not fit the device kernel: {why}",
            coll.name(),
            algo.name()
        ))
    };
    let parities: &[(usize, u8)] = if algo == Algo::Tree && n > 1 {
        &[(0, STEP_EVEN_CH), (1, STEP_ODD_CH)]
    } else {
        &[(0, 0)]
    };
    let mut steps = Vec::new();
    let mut chunked = false;
    for &(ch, only) in parities {
        let (s, c) = device_steps(&|count, lo, hi| schedule(ch, count, lo, hi), n, &unfit)?;
        steps.extend(s.into_iter().map(|d| DevStep {
            flags: d.flags | only,
            ..d
        }));
        chunked |= c;
    }
    let t = Template::new(&steps, if chunked { n as u32 } else { 1 })?;
    for &(ch, _) in parities {
        for (count, lo, hi) in [(1009, 3, 1000), (5 * n + 3, 0, 5 * n + 3), (64, 7, 8)] {
            if t.expand(count, lo, hi, ch) != schedule(ch, count, lo, hi) {
                return Err(unfit(format!(
                    "expansion differs on [{lo}, {hi}) of {count}, channel {ch}"
                )));
            }
        }
    }
    Ok(t)
}

/// The steps of one schedule (`schedule(count, lo, hi)`) in device form,
/// and whether any addresses a chunk.
fn device_steps(
    schedule: &dyn Fn(usize, usize, usize) -> Vec<Step>,
    n: usize,
    unfit: &dyn Fn(String) -> Error,
) -> Result<(Vec<DevStep>, bool)> {
    // A probe: chunks of S elements in a range of n*S, blocks C apart with C
    // far above the range, so that every offset reads back as block*C + j*S.
    const S: usize = 1 << 20;
    const C: usize = 1 << 40;
    let len = n * S;
    let probe = schedule(C, 0, len);
    let mut steps = Vec::with_capacity(probe.len());
    let mut chunked = false;
    for st in &probe {
        let whole = st.count == len;
        if !whole && st.count != S {
            return Err(unfit(format!("a step of {} elements", st.count)));
        }
        let decode = |r: Option<Region>| -> Result<(u8, u16, Option<usize>)> {
            let Some(r) = r else {
                return Ok((BUF_NONE, 0, None));
            };
            let (block, rem) = (r.offset / C, r.offset % C);
            let buf = match r.buf {
                Buf::Input => BUF_INPUT,
                Buf::Output => BUF_OUTPUT,
                // The kernels have no scratch (nor PAT, the one user).
                Buf::Scratch => return Err(unfit("a step through scratch".into())),
            };
            let j = match (whole, rem % S) {
                (true, _) if rem == 0 => None,
                (false, 0) if rem / S < n => Some(rem / S),
                _ => return Err(unfit(format!("offset {} is no chunk", r.offset))),
            };
            Ok((buf, block as u16, j))
        };
        let (src_buf, src_block, sj) = decode(st.src)?;
        let (dst_buf, dst_block, dj) = decode(st.dst)?;
        let chunk = match (sj, dj) {
            (Some(a), Some(b)) if a != b => return Err(unfit("src and dst chunks differ".into())),
            (Some(j), _) | (None, Some(j)) => {
                chunked = true;
                j as u8
            }
            (None, None) if src_buf == BUF_NONE && dst_buf == BUF_NONE => {
                return Err(unfit("a step touches no buffer".into()))
            }
            (None, None) => CHUNK_WHOLE,
        };
        let mut flags = 0;
        if st.send_local {
            flags |= STEP_SEND_LOCAL;
        }
        if st.finalize {
            flags |= STEP_FINALIZE;
        }
        steps.push(DevStep {
            recv: st.recv.map_or(-1, |p| p as i16),
            send: st.send.map_or(-1, |p| p as i16),
            src_buf,
            dst_buf,
            chunk,
            flags,
            src_block,
            dst_block,
            pad: 0,
        });
    }
    Ok((steps, chunked))
}

/// How a collective is laid over thread blocks and FIFO slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub channels: u32,
    pub slice_elems: u32,
}

/// Slices per chunk at least, where the data allows, so that the steps of a
/// channel overlap (a chunk goes out while the previous one is reduced).
const MIN_SLICES: usize = 4;

/// The channels (thread blocks) a launch moving `bytes` per rank uses.
pub(crate) fn channels(cfg: &DeviceConfig, bytes: usize) -> usize {
    bytes.div_ceil(cfg.channel_bytes).clamp(1, cfg.channels)
}

/// One channel per `channel_bytes` of data up to the configured number; a
/// slice of a FIFO slot at most, a few per chunk where that keeps them above
/// `min_slice_bytes` (each slice costs a fence and a flag round); all
/// multiples of 16 bytes, as the kernel's ranges are (coll.cu's `per` and
/// `oxccl_chunk`).
/// `channels` is the caller's (a tuner's, or [`channels`]), kept within
/// 1 and the window's count.
pub(crate) fn shape(
    cfg: &DeviceConfig,
    count: usize,
    esize: usize,
    nchunks: usize,
    channels: usize,
) -> Shape {
    let v = 16 / esize;
    let channels = channels.clamp(1, cfg.channels);
    let per = count.div_ceil(channels).next_multiple_of(v);
    let chunk = per.div_ceil(nchunks.max(1)).next_multiple_of(v);
    let slot = (cfg.slot_bytes / esize / v * v).max(v);
    let least = (cfg.min_slice_bytes / esize).next_multiple_of(v).min(slot);
    let slice = chunk
        .div_ceil(MIN_SLICES)
        .next_multiple_of(v)
        .max(least)
        .min(chunk)
        .clamp(v, slot);
    Shape {
        channels: channels as u32,
        slice_elems: slice as u32,
    }
}

/// The shape of a launch through the LL FIFO: as [`shape`], with slices of
/// the data of a whole LL slot (half its bytes) where the chunk has as
/// much. Each slice is a message of its own through the network, which
/// cost about 10 us of a 2-rank all-reduce of 64 B on one H200 when the
/// slices were cut 4 to a chunk.
pub(crate) fn shape_ll(
    cfg: &DeviceConfig,
    count: usize,
    esize: usize,
    nchunks: usize,
    channels: usize,
) -> Shape {
    let data = (cfg.ll_slot_bytes / 2) & !15;
    let ll = DeviceConfig {
        slot_bytes: data,
        min_slice_bytes: data,
        ..cfg.clone()
    };
    shape(&ll, count, esize, nchunks, channels)
}

/// The slices channel `ch` of a launch moves per step of `t`, as coll.cu's
/// `oxccl_coll_body` loops (the channel's range, its chunks, slices of
/// `shape.slice_elems`): `(step, slices)` in the order the kernel posts
/// them when `ordered` (groups of `group` slices, each step in turn), else
/// one total per step. The proxy's profiler counts its steps with it, so
/// it must match the kernel exactly.
pub(crate) fn slice_runs(
    t: &Template,
    count: usize,
    esize: usize,
    shape: Shape,
    group: usize,
    ch: usize,
    ordered: bool,
) -> Vec<(usize, u64)> {
    let (count, v) = (count as u64, (16 / esize) as u64);
    let nch = u64::from(shape.channels.max(1));
    let per = count.div_ceil(nch).next_multiple_of(v);
    let lo = (ch as u64 * per).min(count);
    let hi = (lo + per).min(count);
    let s = u64::from(shape.slice_elems).max(1);
    let mut runs = Vec::new();
    if lo >= hi {
        return runs;
    }
    let chunks: Vec<(u64, u64)> = t.steps[..t.nsteps as usize]
        .iter()
        .map(|d| {
            if !runs_on_channel(d.flags, ch) {
                return (lo, lo);
            }
            if d.chunk == CHUNK_WHOLE {
                return (lo, hi);
            }
            let n = u64::from(t.nchunks.max(1));
            let cs = (hi - lo).div_ceil(n).next_multiple_of(v);
            let clo = (lo + u64::from(d.chunk) * cs).min(hi);
            (clo, (clo + cs).min(hi))
        })
        .collect();
    if !ordered {
        for (i, &(clo, chi)) in chunks.iter().enumerate() {
            if chi > clo {
                runs.push((i, (chi - clo).div_ceil(s)));
            }
        }
        return runs;
    }
    let g = group.max(1) as u64 * s;
    for j in 0.. {
        let mut any = false;
        for (i, &(clo, chi)) in chunks.iter().enumerate() {
            let g0 = clo + j * g;
            if g0 >= chi {
                continue;
            }
            any = true;
            runs.push((i, ((g0 + g).min(chi) - g0).div_ceil(s)));
        }
        if !any {
            break;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn colls(n: usize) -> Vec<Coll> {
        let mut v = vec![Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter];
        for root in 0..n {
            v.push(Coll::Broadcast { root });
            v.push(Coll::Reduce { root });
        }
        v
    }

    #[test]
    fn every_ring_schedule_has_a_template() {
        for n in 1..=9 {
            for coll in colls(n) {
                for rank in 0..n {
                    let t = template(Algo::Ring, coll, rank, n).unwrap();
                    assert!(t.nsteps >= 1);
                }
            }
        }
    }

    #[test]
    fn recursive_doubling_has_a_template() {
        for n in 1..=9 {
            for rank in 0..n {
                template(Algo::RecDoubling, Coll::AllReduce, rank, n).unwrap();
            }
        }
        let t = template(Algo::RecDoubling, Coll::AllReduce, 0, 2).unwrap();
        assert_eq!(t.nsteps, 1);
        let s = t.steps[0];
        assert_eq!((s.send, s.recv, s.chunk), (1, 1, CHUNK_WHOLE));
        assert_eq!(s.flags, STEP_SEND_LOCAL | STEP_FINALIZE);
    }

    /// The tree all-reduce: every step moves the channel's whole range and
    /// belongs to one of the two trees (even or odd channels). In tree 0 of
    /// 3 ranks rank 0 is a leaf (send up, then receive the result) and rank
    /// 1 the root, which folds both children and sends the result to each;
    /// in tree 1, shifted by one position, rank 2 is the root.
    #[test]
    fn the_tree_has_a_template() {
        for n in 2..=9 {
            for rank in 0..n {
                let t = template(Algo::Tree, Coll::AllReduce, rank, n).unwrap();
                let steps = &t.steps[..t.nsteps as usize];
                assert!(steps.iter().all(|s| s.chunk == CHUNK_WHOLE));
                assert!(steps
                    .iter()
                    .all(|s| (s.flags & (STEP_EVEN_CH | STEP_ODD_CH)).count_ones() == 1));
            }
        }
        let of = |rank, ch| {
            let t = template(Algo::Tree, Coll::AllReduce, rank, 3).unwrap();
            t.steps[..t.nsteps as usize]
                .iter()
                .filter(|s| runs_on_channel(s.flags, ch))
                .map(|s| (s.recv, s.send))
                .collect::<Vec<_>>()
        };
        assert_eq!(of(0, 0), vec![(-1, 1), (1, -1)]);
        assert_eq!(of(1, 0), vec![(0, -1), (2, -1), (-1, 0), (-1, 2)]);
        assert_eq!(of(1, 2), of(1, 0));
        assert_eq!(of(2, 1).len(), 4, "the root of tree 1");
        let root = template(Algo::Tree, Coll::AllReduce, 1, 3).unwrap();
        assert_eq!(root.steps[1].flags, STEP_FINALIZE | STEP_EVEN_CH);
    }

    #[test]
    fn too_many_ranks_for_the_kernel_is_an_error() {
        assert!(template(Algo::Ring, Coll::AllReduce, 0, 40).is_err());
    }

    /// The kernel's slice order for one channel of `count` elements (the
    /// generic loop of coll.cu's `oxccl_coll_body`): per slice, the peer it
    /// waits on and the peer it sends to.
    fn kernel_order(
        t: &Template,
        count: u64,
        slice: u64,
        group: u64,
        ch: usize,
    ) -> Vec<(i16, i16)> {
        const V: u64 = 4;
        let chunk = |c: u8| -> (u64, u64) {
            if c == CHUNK_WHOLE {
                return (0, count);
            }
            let n = t.nchunks as u64;
            let cs = count.div_ceil(n).next_multiple_of(V);
            let lo = (c as u64 * cs).min(count);
            (lo, (lo + cs).min(count))
        };
        let mut ops = Vec::new();
        for j in 0.. {
            let mut any = false;
            for d in &t.steps[..t.nsteps as usize] {
                if !runs_on_channel(d.flags, ch) {
                    continue;
                }
                let (clo, chi) = chunk(d.chunk);
                let g0 = clo + j * group * slice;
                if g0 >= chi {
                    continue;
                }
                any = true;
                let n = (chi.min(g0 + group * slice) - g0).div_ceil(slice) as usize;
                if d.flags & STEP_SEND_LOCAL != 0 {
                    ops.extend(std::iter::repeat_n((-1, d.send), n));
                    ops.extend(std::iter::repeat_n((d.recv, -1), n));
                } else {
                    ops.extend(std::iter::repeat_n((d.recv, d.send), n));
                }
            }
            if !any {
                break;
            }
        }
        ops
    }

    /// Runs every rank's slice order against FIFOs of `slots`; a slice goes
    /// when its slice has arrived and its slot is free. Returns whether all
    /// ranks finished, with every FIFO drained.
    fn completes(orders: &[Vec<(i16, i16)>], slots: usize) -> bool {
        let n = orders.len();
        let mut fifo = vec![vec![0usize; n]; n];
        let mut pc = vec![0usize; n];
        loop {
            let mut moved = false;
            for r in 0..n {
                while let Some(&(from, to)) = orders[r].get(pc[r]) {
                    let ready = (from < 0 || fifo[from as usize][r] > 0)
                        && (to < 0 || fifo[r][to as usize] < slots);
                    if !ready {
                        break;
                    }
                    if from >= 0 {
                        fifo[from as usize][r] -= 1;
                    }
                    if to >= 0 {
                        fifo[r][to as usize] += 1;
                    }
                    pc[r] += 1;
                    moved = true;
                }
            }
            if !moved {
                let done = (0..n).all(|r| pc[r] == orders[r].len());
                return done && fifo.iter().flatten().all(|&f| f == 0);
            }
        }
    }

    #[test]
    fn grouped_slices_never_deadlock_with_half_the_slots() {
        let slots = 8;
        for n in 2..=9 {
            for coll in colls(n) {
                for algo in [Algo::Ring, Algo::RecDoubling, Algo::Tree] {
                    if algo != Algo::Ring && coll != Coll::AllReduce {
                        continue;
                    }
                    let ts: Vec<Template> = (0..n)
                        .map(|r| template(algo, coll, r, n).unwrap())
                        .collect();
                    for (count, slice) in [(4u64, 4u64), (1000, 16), (100_000, 256), (4096, 4)] {
                        for (group, ch) in [1, 2, slots as u64 / 2]
                            .into_iter()
                            .flat_map(|g| [(g, 0), (g, 1)])
                        {
                            let orders: Vec<_> = ts
                                .iter()
                                .map(|t| kernel_order(t, count, slice, group, ch))
                                .collect();
                            assert!(
                                completes(&orders, slots),
                                "{} {} n={n} count={count} slice={slice} group={group} channel {ch} deadlocks",
                                algo.name(),
                                coll.name()
                            );
                        }
                    }
                }
            }
        }
        // A fused send/recv group with every peer (all-to-all).
        for n in 2..=9 {
            let orders: Vec<_> = (0..n)
                .map(|r| {
                    let mut steps: Vec<DevStep> = (0..n)
                        .filter(|&p| p != r)
                        .map(|p| Template::send(p).steps[0])
                        .collect();
                    steps.extend(
                        (0..n)
                            .filter(|&p| p != r)
                            .map(|p| Template::recv(p).steps[0]),
                    );
                    let t = Template::from_steps(&steps).unwrap();
                    kernel_order(&t, 100_000, 256, slots as u64 / 2, 0)
                })
                .collect();
            assert!(
                completes(&orders, slots),
                "all-to-all on {n} ranks deadlocks"
            );
            // The model sees a deadlock where there is one: groups larger
            // than the FIFO, every rank sending before it receives.
            assert!(!completes(&orders, 2));
        }
    }

    #[test]
    fn shapes_stay_aligned_and_inside_a_slot() {
        let cfg = DeviceConfig::default();
        let s = shape(&cfg, 2, 4, 1, channels(&cfg, 2 * 4));
        assert_eq!((s.channels, s.slice_elems), (1, 4));
        // Small data: one slice, however it splits.
        let s = shape(&cfg, 1000, 4, 1, channels(&cfg, 1000 * 4));
        assert_eq!(s.slice_elems, 1000);
        let s = shape(&cfg, 1 << 28, 4, 2, channels(&cfg, (1 << 28) * 4));
        assert_eq!(s.channels as usize, cfg.channels);
        assert_eq!(s.slice_elems as usize, cfg.slot_bytes / 4);
        for count in [1, 3, 1000, 1_000_003, 1 << 20] {
            for esize in [1, 2, 4, 8] {
                let s = shape(&cfg, count, esize, 3, channels(&cfg, count * esize));
                assert_eq!(s.slice_elems as usize * esize % 16, 0);
                assert!(s.slice_elems as usize * esize <= cfg.slot_bytes);
            }
        }
    }

    #[test]
    fn ll_slices_fit_the_data_of_an_ll_slot() {
        let cfg = DeviceConfig {
            ll_slot_bytes: super::super::config::LL_SLOT_BYTES,
            ..DeviceConfig::default()
        };
        let data = cfg.ll_slot_bytes / 2;
        for count in [1, 3, 1000, 1_000_003, 1 << 20] {
            for esize in [1, 2, 4, 8] {
                for nchunks in [1, 2, 3, 8] {
                    let s = shape_ll(&cfg, count, esize, nchunks, channels(&cfg, count * esize));
                    let b = s.slice_elems as usize * esize;
                    assert_eq!(b % 16, 0);
                    assert!(b <= data, "{b} B slices of an LL slot of {data} B of data");
                }
            }
        }
        // An 8-byte all-reduce is one slice of one line's data rounded to 16 B.
        let s = shape_ll(&cfg, 2, 4, 2, 1);
        assert_eq!((s.channels, s.slice_elems), (1, 4));
        // Up to a slot's data, a chunk is one slice, one message.
        let s = shape_ll(&cfg, 1024, 4, 1, 1);
        assert_eq!(s.slice_elems, 1024);
        let s = shape_ll(&cfg, 16 << 10, 4, 2, 1);
        assert_eq!(s.slice_elems as usize * 4, data);
    }

    /// The proxy's count of a launch's slices (`slice_runs`) is the
    /// kernel's, per peer and direction and in order, on random shapes.
    #[test]
    fn slice_runs_follow_the_kernel_loop() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..300 {
            let n = rng.random_range(2..=6);
            let rank = rng.random_range(0..n);
            let algo = if n == 2 && rng.random_bool(0.3) {
                Algo::RecDoubling
            } else if rng.random_bool(0.2) {
                Algo::Tree
            } else {
                Algo::Ring
            };
            let coll = if algo == Algo::Ring {
                colls(n)[rng.random_range(0..colls(n).len())]
            } else {
                Coll::AllReduce
            };
            let t = template(algo, coll, rank, n).unwrap();
            let count = rng.random_range(1..5000u64);
            let slice = 4 * rng.random_range(1..40u64);
            let group = rng.random_range(1..4u64);
            // Two channels: the tree's odd channels run its second tree.
            let shape = Shape {
                channels: 2,
                slice_elems: slice as u32,
            };
            let ch = rng.random_range(0..2usize);
            let per = count.div_ceil(2).next_multiple_of(4);
            let (lo, hi) = (
                (ch as u64 * per).min(count),
                ((ch as u64 + 1) * per).min(count),
            );
            let want = kernel_order(&t, hi - lo, slice, group, ch);
            let runs = slice_runs(&t, count as usize, 4, shape, group as usize, ch, true);
            let mut got = Vec::new();
            for &(i, k) in &runs {
                let d = t.steps[i];
                if d.flags & STEP_SEND_LOCAL != 0 {
                    got.extend(std::iter::repeat_n((-1, d.send), k as usize));
                    got.extend(std::iter::repeat_n((d.recv, -1), k as usize));
                } else {
                    got.extend(std::iter::repeat_n((d.recv, d.send), k as usize));
                }
            }
            // Per connection the order is the kernel's; across connections
            // only the counts matter.
            for peer in 0..n as i16 {
                let side = |v: &[(i16, i16)], send: bool| -> usize {
                    v.iter()
                        .filter(|&&(r, s)| if send { s == peer } else { r == peer })
                        .count()
                };
                assert_eq!(side(&got, true), side(&want, true), "{t:?} {count} {slice}");
                assert_eq!(
                    side(&got, false),
                    side(&want, false),
                    "{t:?} {count} {slice}"
                );
            }
            let totals = slice_runs(&t, count as usize, 4, shape, group as usize, ch, false);
            for i in 0..t.nsteps as usize {
                let a: u64 = runs.iter().filter(|r| r.0 == i).map(|r| r.1).sum();
                let b: u64 = totals.iter().filter(|r| r.0 == i).map(|r| r.1).sum();
                assert_eq!(a, b);
            }
        }
    }
}
