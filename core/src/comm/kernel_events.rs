//! The profiler's kernel-channel events on the peer-kernel path: a thread
//! per communicator watches the GPU timestamps its timed launches write
//! (`exec::device::Stamps`) and starts one KernelCh event per channel and
//! operation when the channel's block starts, stopping it with the GPU's
//! end time when the block ends. NCCL does the same from its proxy thread,
//! off the enqueuing thread, with the operation's event as the parent
//! (already stopped by then: a collective's stop means "enqueued").
//!
//! The pairing of stamps with events is [`Tracker`], which reads through
//! [`StampSource`] and reports through [`KernelSink`], so that it is tested
//! without a GPU or a plugin.

use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_plugin::ffi::profiler::{NCCL_PROFILER_KERNEL_CH_STOP, NCCL_PROFILE_KERNEL_CH};
use tracing::warn;

use crate::error::{Error, Result};
use crate::exec::device::Stamps;
use crate::plugin::profiler::{reported_channels, Event, Handle, ProfilerComm, StateArgs};

/// Where a launch's per-channel (start, end) times are read.
pub(crate) trait StampSource {
    /// 0 for a time not written yet.
    fn read(&self, slot: usize, ch: usize) -> (u64, u64);
    fn release(&self, slot: usize, channels: usize);
}

impl StampSource for Stamps {
    fn read(&self, slot: usize, ch: usize) -> (u64, u64) {
        Stamps::read(self, slot, ch)
    }

    fn release(&self, slot: usize, channels: usize) {
        Stamps::release(self, slot, channels)
    }
}

/// Where kernel-channel events go.
pub(crate) trait KernelSink {
    type Parent: Copy;
    type Event;
    fn start(&mut self, parent: Self::Parent, channel: usize, gpu_start: u64) -> Self::Event;
    /// `gpu_end`: `None` when the channel never reported its end in time.
    fn stop(&mut self, ev: Self::Event, gpu_end: Option<u64>);
}

/// A timed launch and the operations it ran.
pub(crate) struct Track<P> {
    pub slot: usize,
    pub channels: usize,
    pub parents: Vec<P>,
    pub since: Instant,
}

enum Channel<E> {
    Waiting,
    Running(Vec<E>),
    Done,
}

struct Live<P, E> {
    track: Track<P>,
    chans: Vec<Channel<E>>,
}

/// Pairs timed launches with their events.
pub(crate) struct Tracker<P, E> {
    live: VecDeque<Live<P, E>>,
}

impl<P: Copy, E> Tracker<P, E> {
    pub fn new() -> Self {
        Tracker {
            live: VecDeque::new(),
        }
    }

    pub fn add(&mut self, track: Track<P>) {
        let chans = (0..reported_channels(track.channels))
            .map(|_| Channel::Waiting)
            .collect();
        self.live.push_back(Live { track, chans });
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Starts and stops what the stamps show; a launch older than `limit`
    /// that has not ended is given up (its open events stopped without an
    /// end time). Returns the number of launches given up. Each reported
    /// channel (see [`crate::plugin::profiler::REPORTED_CHANNELS`]) starts at the earliest start of
    /// the launch's channels folded onto it and ends at the latest end,
    /// once all of them have ended.
    pub fn poll<S, K>(&mut self, src: &S, sink: &mut K, now: Instant, limit: Duration) -> usize
    where
        S: StampSource + ?Sized,
        K: KernelSink<Parent = P, Event = E>,
    {
        let mut gave_up = 0;
        self.live.retain_mut(|l| {
            let (slot, n) = (l.track.slot, l.track.channels);
            let folds = l.chans.len();
            for (ch, state) in l.chans.iter_mut().enumerate() {
                if matches!(state, Channel::Done) {
                    continue;
                }
                let (mut start, mut end) = (0u64, Some(0u64));
                for (s, e) in (ch..n).step_by(folds).map(|c| src.read(slot, c)) {
                    if s != 0 && (start == 0 || s < start) {
                        start = s;
                    }
                    // Ended once every folded channel has.
                    end = end.filter(|_| e != 0).map(|m| m.max(e));
                }
                let end = end.unwrap_or(0);
                if start == 0 {
                    continue;
                }
                let evs = match std::mem::replace(state, Channel::Done) {
                    Channel::Waiting => l
                        .track
                        .parents
                        .iter()
                        .map(|&p| sink.start(p, ch, start))
                        .collect(),
                    Channel::Running(evs) => evs,
                    Channel::Done => unreachable!("skipped above"),
                };
                if end == 0 {
                    *state = Channel::Running(evs);
                } else {
                    evs.into_iter().for_each(|e| sink.stop(e, Some(end)));
                }
            }
            let done = l.chans.iter().all(|c| matches!(c, Channel::Done));
            let late = now.saturating_duration_since(l.track.since) > limit;
            if !done && !late {
                return true;
            }
            if !done {
                gave_up += 1;
                for c in std::mem::take(&mut l.chans) {
                    if let Channel::Running(evs) = c {
                        evs.into_iter().for_each(|e| sink.stop(e, None));
                    }
                }
            }
            src.release(slot, l.track.channels);
            false
        });
        gave_up
    }
}

/// Kernel-channel events into the communicator's profiler.
struct ToProfiler<'a>(&'a ProfilerComm);

impl KernelSink for ToProfiler<'_> {
    type Parent = Handle;
    type Event = Handle;

    fn start(&mut self, parent: Handle, channel: usize, gpu_start: u64) -> Handle {
        self.0.start(
            NCCL_PROFILE_KERNEL_CH,
            Event::KernelCh {
                parent,
                channel: channel.min(255) as u8,
                p_timer: gpu_start,
            },
        )
    }

    fn stop(&mut self, ev: Handle, gpu_end: Option<u64>) {
        if let Some(t) = gpu_end {
            self.0.record(
                ev,
                NCCL_PROFILER_KERNEL_CH_STOP,
                StateArgs::KernelCh { p_timer: t },
            );
        }
        self.0.stop(ev);
    }
}

/// KernelCh events of an operation on host memory, one per channel (lane
/// or thread) under its event, as the device path reports its kernels'
/// channels. Host memory runs no kernel, but profilers complete an
/// operation on its channel events: NCCL's Inspector writes a record only
/// once the last of them stops. Started at the host's clock (ns since the
/// epoch, as the GPU's global timer counts; a profiler takes them for
/// kernel times, which on host memory are the lanes' own) when made,
/// stopped with a
/// KernelChStop state at that clock when dropped (before the operation's
/// own event stops: declare it after).
pub(crate) struct HostChannels<'a> {
    prof: &'a ProfilerComm,
    events: Vec<Handle>,
}

impl<'a> HostChannels<'a> {
    /// `None` without a profiler, an event to hang under, or the
    /// KernelCh bit in `mask`.
    pub fn start(
        prof: Option<&'a ProfilerComm>,
        mask: i32,
        parent: Option<Handle>,
        channels: usize,
    ) -> Option<HostChannels<'a>> {
        let (prof, parent) = (prof?, parent?);
        if mask & NCCL_PROFILE_KERNEL_CH == 0 || parent == Handle::NONE {
            return None;
        }
        let t = host_ns();
        // As many as the operation's event reported (its nChannels, at
        // most 32: the array plugins keep them in).
        let events = (0..reported_channels(channels.max(1)))
            .map(|c| {
                prof.start(
                    mask,
                    Event::KernelCh {
                        parent,
                        channel: c as u8,
                        p_timer: t,
                    },
                )
            })
            .collect();
        Some(HostChannels { prof, events })
    }
}

impl Drop for HostChannels<'_> {
    fn drop(&mut self) {
        let t = host_ns();
        for &ev in &self.events {
            self.prof.record(
                ev,
                NCCL_PROFILER_KERNEL_CH_STOP,
                StateArgs::KernelCh { p_timer: t },
            );
            self.prof.stop(ev);
        }
    }
}

/// The host's clock for [`HostChannels`]: nanoseconds since the epoch.
fn host_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How often a launch in flight is looked at: the times themselves come
/// from the GPU, so this only bounds how late an event is reported.
const POLL: Duration = Duration::from_micros(20);
/// How long a communicator being destroyed waits for its last launches.
const DRAIN: Duration = Duration::from_secs(2);

/// The watching thread of one communicator; stops (after its last
/// launches, within [`DRAIN`]) when dropped.
pub(crate) struct KernelEvents {
    tx: Option<mpsc::Sender<Track<Handle>>>,
    thread: Option<JoinHandle<()>>,
}

impl KernelEvents {
    /// `limit`: how long a launch may run before its events are given up
    /// (the communicator's timeout: past it the kernel has trapped).
    pub fn spawn(
        prof: Arc<ProfilerComm>,
        stamps: Arc<Stamps>,
        limit: Duration,
        rank: usize,
    ) -> Result<KernelEvents> {
        let (tx, rx) = mpsc::channel::<Track<Handle>>();
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-kernel-events-{rank}"))
            .spawn(move || {
                let mut tracker = Tracker::new();
                let mut sink = ToProfiler(&prof);
                let mut closing: Option<Instant> = None;
                loop {
                    if closing.is_none() {
                        let next = if tracker.is_empty() {
                            rx.recv_timeout(Duration::from_secs(3600))
                        } else {
                            rx.try_recv().map_err(|e| match e {
                                mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                                mpsc::TryRecvError::Disconnected => {
                                    RecvTimeoutError::Disconnected
                                }
                            })
                        };
                        match next {
                            Ok(t) => {
                                tracker.add(t);
                                rx.try_iter().for_each(|t| tracker.add(t));
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => {
                                closing = Some(Instant::now() + DRAIN)
                            }
                        }
                    }
                    let now = Instant::now();
                    let limit = match closing {
                        Some(end) if now >= end => Duration::ZERO,
                        _ => limit,
                    };
                    let gave_up = tracker.poll(&*stamps, &mut sink, now, limit);
                    if gave_up > 0 {
                        warn!(target: "oxccl::prof", "rank {rank}: {gave_up} kernel launch(es) reported no end within {limit:?}; their KernelCh events end without a GPU time");
                    }
                    if closing.is_some() && tracker.is_empty() {
                        break;
                    }
                    if !tracker.is_empty() {
                        std::thread::sleep(POLL);
                    }
                }
            })
            .map_err(|e| Error::System(format!("cannot start the kernel-event thread: {e}")))?;
        Ok(KernelEvents {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn track(&self, slot: usize, channels: usize, parents: Vec<Handle>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Track {
                slot,
                channels,
                parents,
                since: Instant::now(),
            });
        }
    }
}

impl Drop for KernelEvents {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::profiler::REPORTED_CHANNELS;
    use std::cell::RefCell;

    /// Stamps as a table the test writes, as the GPU would.
    #[derive(Default)]
    struct Fake {
        words: RefCell<std::collections::HashMap<(usize, usize), (u64, u64)>>,
        released: RefCell<Vec<usize>>,
    }

    impl Fake {
        fn set(&self, slot: usize, ch: usize, start: u64, end: u64) {
            self.words.borrow_mut().insert((slot, ch), (start, end));
        }
    }

    impl StampSource for Fake {
        fn read(&self, slot: usize, ch: usize) -> (u64, u64) {
            self.words
                .borrow()
                .get(&(slot, ch))
                .copied()
                .unwrap_or_default()
        }
        fn release(&self, slot: usize, _channels: usize) {
            self.released.borrow_mut().push(slot);
        }
    }

    /// Records what a profiler would be told.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl KernelSink for Log {
        type Parent = char;
        type Event = (char, usize);
        fn start(&mut self, p: char, ch: usize, t: u64) -> (char, usize) {
            self.0.push(format!("start {p} ch{ch} at {t}"));
            (p, ch)
        }
        fn stop(&mut self, (p, ch): (char, usize), t: Option<u64>) {
            self.0.push(format!("stop {p} ch{ch} at {t:?}"));
        }
    }

    fn track(slot: usize, channels: usize, parents: &[char], since: Instant) -> Track<char> {
        Track {
            slot,
            channels,
            parents: parents.to_vec(),
            since,
        }
    }

    /// A launch on 64 channels is reported on 32: channel c and c + 32
    /// make one event, from the earlier start to the later end, stopped
    /// only once both have ended.
    #[test]
    fn channels_above_the_reported_count_fold_onto_it() {
        let (src, mut log, mut t) = (Fake::default(), Log::default(), Tracker::new());
        let t0 = Instant::now();
        let limit = Duration::from_secs(10);
        t.add(track(0, 2 * REPORTED_CHANNELS, &['a'], t0));
        src.set(0, 5 + REPORTED_CHANNELS, 50, 70);
        t.poll(&src, &mut log, t0, limit);
        assert_eq!(log.0, ["start a ch5 at 50"]);
        src.set(0, 5, 40, 0);
        t.poll(&src, &mut log, t0, limit);
        assert_eq!(log.0.len(), 1, "channel 5 has not ended: {:?}", log.0);
        src.set(0, 5, 40, 90);
        t.poll(&src, &mut log, t0, limit);
        assert_eq!(log.0[1..], ["stop a ch5 at Some(90)"]);
        for c in (0..2 * REPORTED_CHANNELS).filter(|c| c % REPORTED_CHANNELS != 5) {
            src.set(0, c, 10, 20);
        }
        t.poll(&src, &mut log, t0, limit);
        let chans: std::collections::BTreeSet<String> = log
            .0
            .iter()
            .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
            .collect();
        assert_eq!(chans.len(), REPORTED_CHANNELS, "{:?}", log.0);
        assert_eq!(log.0.len(), 2 * REPORTED_CHANNELS);
        assert!(t.is_empty());
    }

    #[test]
    fn channels_start_and_stop_as_their_stamps_arrive() {
        let (src, mut log, mut t) = (Fake::default(), Log::default(), Tracker::new());
        let t0 = Instant::now();
        let limit = Duration::from_secs(10);
        t.add(track(3, 2, &['a'], t0));
        assert_eq!(t.poll(&src, &mut log, t0, limit), 0);
        assert!(log.0.is_empty());
        src.set(3, 1, 100, 0);
        t.poll(&src, &mut log, t0, limit);
        assert_eq!(log.0, ["start a ch1 at 100"]);
        // Channel 0 starts and ends between two polls: both reported.
        src.set(3, 0, 90, 150);
        src.set(3, 1, 100, 160);
        t.poll(&src, &mut log, t0, limit);
        assert_eq!(
            log.0[1..],
            [
                "start a ch0 at 90",
                "stop a ch0 at Some(150)",
                "stop a ch1 at Some(160)"
            ]
        );
        assert!(t.is_empty());
        assert_eq!(*src.released.borrow(), [3]);
    }

    #[test]
    fn each_operation_of_a_fused_launch_gets_its_channels() {
        let (src, mut log, mut t) = (Fake::default(), Log::default(), Tracker::new());
        let t0 = Instant::now();
        t.add(track(0, 1, &['s', 'r'], t0));
        src.set(0, 0, 5, 9);
        t.poll(&src, &mut log, t0, Duration::from_secs(1));
        assert_eq!(
            log.0,
            [
                "start s ch0 at 5",
                "start r ch0 at 5",
                "stop s ch0 at Some(9)",
                "stop r ch0 at Some(9)"
            ]
        );
    }

    #[test]
    fn a_launch_that_never_ends_is_given_up_and_its_slot_freed() {
        let (src, mut log, mut t) = (Fake::default(), Log::default(), Tracker::new());
        let t0 = Instant::now();
        let limit = Duration::from_secs(5);
        t.add(track(7, 2, &['a'], t0));
        t.add(track(8, 1, &['b'], t0 + Duration::from_secs(4)));
        src.set(7, 0, 1, 0);
        assert_eq!(t.poll(&src, &mut log, t0, limit), 0);
        // Past the first launch's limit, not the second's.
        let later = t0 + Duration::from_secs(6);
        assert_eq!(t.poll(&src, &mut log, later, limit), 1);
        assert_eq!(log.0, ["start a ch0 at 1", "stop a ch0 at None"]);
        assert_eq!(*src.released.borrow(), [7]);
        assert!(!t.is_empty());
        src.set(8, 0, 2, 3);
        assert_eq!(t.poll(&src, &mut log, later, limit), 0);
        assert!(t.is_empty());
        assert_eq!(*src.released.borrow(), [7, 8]);
    }
}
