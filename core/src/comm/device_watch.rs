//! A GPU communicator's collectives, watched from the host until they end,
//! for ranks that called them with other counts.
//!
//! On the device path the host never waits: the kernels wait on the GPU
//! for their peers' FIFO counters. Ranks whose counts differ take their
//! own channels and protocols from them and never compare operation
//! headers, so a mismatch used to hang the streams until NCCL_TIMEOUT,
//! when a kernel trapped and took the context with it. The host path asks
//! its peers' call books after 100 ms without progress (`exec::drive`);
//! this does the same for launched work: behind every group of
//! collectives a fence (an event) is recorded, and a thread of the
//! communicator looks at the oldest unfinished one. When it has been the
//! oldest for [`ASK_AFTER`] the peers are asked what they called under its
//! numbers, then again after twice the wait, at least every [`ASK_EVERY`]
//! (work queued behind the caller's own kernels may wait long, rightly).
//! A peer that called another collective is named on this rank, which
//! tells the others; a peer's failure notice ends the wait of every rank
//! with work still unfinished. Either way the kernels are told to end
//! (the stop word they poll, as a revoke does), and the error is the
//! communicator's asynchronous error from then on.
//!
//! Counts that differ do not always hang: where each rank's slices fit
//! the other's, both kernels end, and the output is wrong. So the newest
//! finished group is compared too, behind the work and with the next rank
//! of the ring only (ranks that all agree with their successor agree with
//! each other), at most every [`ASK_AFTER`] while work finishes; a peer's
//! failure notice fails finished work not yet compared.
//!
//! [`Schedule`] is the watch without clock or GPU; [`DeviceWatch`] its
//! thread, over [`Fence`]s and a [`Watched`] communicator, so that both
//! are tested without a GPU (see the tests below).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::bootstrap::{PeerCall, CALL_BYTES};
use crate::cuda::Event;
use crate::error::{Error, Result};
use crate::exec::header::OpHeader;

/// How long the oldest unfinished group goes before the peers are asked:
/// as the host path's waits (`exec::drive`).
pub(crate) const ASK_AFTER: Duration = Duration::from_millis(100);
/// The longest gap between two asks while one group stays unfinished.
const ASK_EVERY: Duration = Duration::from_secs(1);
/// How long one ask waits for the peers' answers.
const ASK_WAIT: Duration = Duration::from_millis(500);
/// How often the thread looks at the fences while work is unfinished.
const TICK: Duration = Duration::from_millis(10);

/// What says that a group's work has finished on the GPU.
pub(crate) trait Fence: Send + 'static {
    fn finished(&self) -> bool;
}

impl Fence for Event {
    /// An error (a context that trapped or was torn down) ends the watch of
    /// this group: nothing of it runs any more.
    fn finished(&self) -> bool {
        self.query().unwrap_or(true)
    }
}

/// What the watch needs of its communicator.
pub(crate) trait Watched: Send + Sync + 'static {
    /// This rank's call of collective `seq`, if still in its call book.
    fn own_call(&self, seq: u64) -> Option<[u8; CALL_BYTES]>;
    /// What `peers` called as collective `seq` (those that answer).
    fn ask(&self, peers: &[usize], seq: u64, wait: Duration) -> Vec<(usize, PeerCall)>;
    /// A failure another rank reported: (its rank, its words).
    fn remote_failure(&self) -> Option<(usize, String)>;
    /// Ends the device work for `e`, found while collective `seq` ran:
    /// records it, tells the other ranks, tells the kernels to end; the
    /// error as recorded.
    fn fail(&self, e: Error, seq: u64) -> Error;
}

/// One group of collectives launched together: their numbers, and what
/// says they finished.
struct Group<F> {
    seqs: Range<u64>,
    fence: F,
}

/// The watch as a state machine: groups in launch order (the device
/// orders each operation after the one before), the oldest unfinished one
/// and how long it has been the oldest.
pub(crate) struct Schedule<F> {
    groups: VecDeque<Group<F>>,
    /// When the head group became the head.
    head_since: Instant,
    /// How long the head may wait before the next ask.
    ask_at: Duration,
    /// The last collective of the newest group seen finished.
    done: Option<u64>,
}

impl<F> Schedule<F> {
    pub fn new(now: Instant) -> Schedule<F> {
        Schedule {
            groups: VecDeque::new(),
            head_since: now,
            ask_at: ASK_AFTER,
            done: None,
        }
    }

    /// The last collective of the newest group finished since the last
    /// call, if any.
    pub fn take_done(&mut self) -> Option<u64> {
        self.done.take()
    }

    /// Collectives `seqs` were launched, with `fence` behind them.
    pub fn launched(&mut self, seqs: Range<u64>, fence: F, now: Instant) {
        if self.groups.is_empty() {
            self.head_since = now;
            self.ask_at = ASK_AFTER;
        }
        self.groups.push_back(Group { seqs, fence });
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The numbers of the oldest unfinished group.
    pub fn head(&self) -> Option<Range<u64>> {
        self.groups.front().map(|g| g.seqs.clone())
    }

    /// Drops the finished groups from the front (their fences go to
    /// `freed`), and says which collectives to ask the peers about now:
    /// the head's, once it has waited its turn.
    pub fn poll(
        &mut self,
        now: Instant,
        finished: impl Fn(&F) -> bool,
        freed: &mut Vec<F>,
    ) -> Option<Range<u64>> {
        let mut moved = false;
        while self.groups.front().is_some_and(|g| finished(&g.fence)) {
            if let Some(g) = self.groups.pop_front() {
                if g.seqs.end > g.seqs.start {
                    self.done = Some(g.seqs.end - 1);
                }
                freed.push(g.fence);
            }
            moved = true;
        }
        if moved {
            self.head_since = now;
            self.ask_at = ASK_AFTER;
        }
        let head = self.groups.front()?;
        let waited = now.saturating_duration_since(self.head_since);
        if waited < self.ask_at {
            return None;
        }
        // Again and again while it lasts, ever less often, at least once
        // every ASK_EVERY: a peer may come to it late.
        self.ask_at = waited + waited.min(ASK_EVERY);
        Some(head.seqs.clone())
    }

    /// Forgets every group (the work was ended); their fences go to `freed`.
    pub fn clear(&mut self, freed: &mut Vec<F>) {
        freed.extend(self.groups.drain(..).map(|g| g.fence));
    }
}

/// Compares this rank's calls `seqs` with what every other rank called
/// under those numbers, and fails, naming both calls, where one called
/// another. A peer that has not come to a number yet is asked about the
/// last one it started, which this rank compares with its own (a count
/// of 0 returns at once: that rank went on without waiting).
pub(crate) fn compare(
    w: &dyn Watched,
    seqs: Range<u64>,
    rank: usize,
    nranks: usize,
    wait: Duration,
) -> Result<()> {
    let peers: Vec<usize> = (0..nranks).filter(|&p| p != rank).collect();
    let own = |seq: u64| w.own_call(seq).and_then(|b| OpHeader::decode(&b));
    for seq in seqs {
        let Some(mine) = own(seq) else {
            continue;
        };
        for (peer, answer) in w.ask(&peers, seq, wait) {
            match answer {
                PeerCall::Called(theirs) => mine.check(&theirs, peer, rank)?,
                PeerCall::Started(n) if n > 0 && n <= seq => {
                    let at = n - 1;
                    let Some(earlier) = own(at) else {
                        continue;
                    };
                    for (p, a) in w.ask(&[peer], at, wait) {
                        if let PeerCall::Called(theirs) = a {
                            earlier.check(&theirs, p, rank)?;
                        }
                    }
                }
                PeerCall::Started(_) => {}
            }
        }
    }
    Ok(())
}

/// Compares this rank's finished collective `seq` with what the next rank
/// of the ring called under that number: `Ok(true)` when compared (or
/// nothing is left to compare), `Ok(false)` when that rank has not come to
/// it yet (ask again later).
pub(crate) fn compare_done(
    w: &dyn Watched,
    seq: u64,
    rank: usize,
    nranks: usize,
    wait: Duration,
) -> Result<bool> {
    let next = (rank + 1) % nranks.max(1);
    let Some(mine) = w.own_call(seq).and_then(|b| OpHeader::decode(&b)) else {
        return Ok(true);
    };
    if next == rank {
        return Ok(true);
    }
    for (peer, answer) in w.ask(&[next], seq, wait) {
        if let PeerCall::Called(theirs) = answer {
            mine.check(&theirs, peer, rank)?;
            return Ok(true);
        }
    }
    Ok(false)
}

struct State<F> {
    schedule: Schedule<F>,
    /// A finished collective not yet compared with the next rank's, and
    /// when to ask about it next.
    unchecked: Option<(u64, Instant)>,
    /// Fences of finished groups, for the next groups.
    free: Vec<F>,
    /// The communicator is going: the thread ends.
    closed: bool,
}

struct Shared<F> {
    state: Mutex<State<F>>,
    wake: Condvar,
    /// What ended the device work, once something did.
    failure: Mutex<Option<Error>>,
}

/// The watch of one GPU communicator: its thread and what it found.
pub(crate) struct DeviceWatch<F: Fence = Event> {
    shared: Arc<Shared<F>>,
}

impl<F: Fence> DeviceWatch<F> {
    /// Starts the thread of rank `rank` of `nranks`, which ends with
    /// [`DeviceWatch::close`] or when `comm` is gone.
    pub fn start<W: Watched>(comm: Weak<W>, rank: usize, nranks: usize) -> Result<DeviceWatch<F>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                schedule: Schedule::new(Instant::now()),
                unchecked: None,
                free: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
            failure: Mutex::new(None),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("oxccl-watch-{rank}"))
            .spawn(move || watch(&s, &comm, rank, nranks))
            .map_err(|e| Error::System(format!("starting the device watch thread: {e}")))?;
        Ok(DeviceWatch { shared })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<F>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A fence of a finished group, if one is free (else the caller makes one).
    pub fn take_fence(&self) -> Option<F> {
        self.state().free.pop()
    }

    /// Collectives `seqs` were launched with `fence` behind them.
    pub fn launched(&self, seqs: Range<u64>, fence: F) {
        let mut st = self.state();
        if self.failure().is_some() {
            st.free.push(fence);
            return;
        }
        st.schedule.launched(seqs, fence, Instant::now());
        drop(st);
        self.shared.wake.notify_all();
    }

    /// A fence that was not recorded after all, for later groups.
    pub fn give_back(&self, fence: F) {
        self.state().free.push(fence);
    }

    /// What ended this communicator's device work, if anything did.
    pub fn failure(&self) -> Option<Error> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Ends the thread (the communicator is going).
    pub fn close(&self) {
        self.state().closed = true;
        self.shared.wake.notify_all();
    }
}

/// The thread: sleeps while nothing is unfinished; otherwise looks at the
/// fences every [`TICK`], at a peer's failure notice, and asks the peers
/// when [`Schedule::poll`] says.
fn watch<F: Fence, W: Watched>(s: &Shared<F>, comm: &Weak<W>, rank: usize, nranks: usize) {
    let mut st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        while st.schedule.is_empty() && st.unchecked.is_none() && !st.closed {
            st = s.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if st.closed {
            return;
        }
        let now = Instant::now();
        let State {
            schedule,
            free,
            unchecked,
            ..
        } = &mut *st;
        let ask = schedule.poll(now, F::finished, free);
        // A collective asked about stays until the next rank had it; the
        // newest finished one is taken after that.
        if let Some(d) = schedule.take_done() {
            if unchecked.is_none() {
                *unchecked = Some((d, now));
            }
        }
        let check = match *unchecked {
            Some((seq, at)) if at <= now => {
                *unchecked = Some((seq, now + ASK_AFTER));
                Some(seq)
            }
            _ => None,
        };
        let head = schedule.head();
        drop(st);
        let Some(w) = comm.upgrade() else {
            return;
        };
        // A peer's failure notice ends unfinished work, and fails finished
        // work not yet compared (the peer may have found it wrong).
        let remote = || {
            w.remote_failure()
                .map(|(who, msg)| Error::Remote(format!("rank {who} failed: {msg}")))
        };
        let found = match (head, check) {
            (Some(h), _) => match remote() {
                Some(e) => Some((e, h.start)),
                None => ask.and_then(|seqs| {
                    let first = seqs.start;
                    compare(&*w, seqs, rank, nranks, ASK_WAIT)
                        .err()
                        .map(|e| (e, first))
                }),
            },
            (None, Some(seq)) => remote().map(|e| (e, seq)),
            (None, None) => None,
        };
        let found = found.or_else(|| {
            let seq = check?;
            match compare_done(&*w, seq, rank, nranks, ASK_WAIT) {
                Err(e) => Some((e, seq)),
                Ok(done) => {
                    if done {
                        let mut st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
                        if st.unchecked.is_some_and(|(q, _)| q == seq) {
                            st.unchecked = None;
                        }
                    }
                    None
                }
            }
        });
        if let Some((e, seq)) = found {
            let e = w.fail(e, seq);
            *s.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            let mut st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
            let State { schedule, free, .. } = &mut *st;
            schedule.clear(free);
            // Later launches are refused (see `DeviceWatch::launched`).
            return;
        }
        drop(w);
        st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
        if (!st.schedule.is_empty() || st.unchecked.is_some()) && !st.closed {
            st = s
                .wake
                .wait_timeout(st, TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_head_is_asked_about_after_its_wait_then_less_often() {
        let t0 = Instant::now();
        let mut s: Schedule<bool> = Schedule::new(t0);
        let mut freed = Vec::new();
        assert_eq!(s.poll(t0, |&f| f, &mut freed), None, "nothing launched");
        s.launched(0..1, true, t0);
        s.launched(1..3, false, t0 + 10 * MS);
        // The first group finished: the second is the head from now.
        assert_eq!(s.poll(t0 + 50 * MS, |&f| f, &mut freed), None);
        assert_eq!(freed, vec![true]);
        assert_eq!(s.head(), Some(1..3));
        assert_eq!(s.poll(t0 + 149 * MS, |&f| f, &mut freed), None);
        assert_eq!(s.poll(t0 + 151 * MS, |&f| f, &mut freed), Some(1..3));
        // Next after twice the wait so far (101 ms -> 202 ms).
        assert_eq!(s.poll(t0 + 200 * MS, |&f| f, &mut freed), None);
        assert_eq!(s.poll(t0 + 253 * MS, |&f| f, &mut freed), Some(1..3));
        // Long waits are asked about every second.
        let at = t0 + Duration::from_secs(10);
        assert_eq!(s.poll(at, |&f| f, &mut freed), Some(1..3));
        assert_eq!(s.poll(at + 999 * MS, |&f| f, &mut freed), None);
        assert_eq!(s.poll(at + 1001 * MS, |&f| f, &mut freed), Some(1..3));
        s.clear(&mut freed);
        assert!(s.is_empty());
        assert_eq!(freed, vec![true, false]);
    }

    #[test]
    fn a_group_launched_after_a_quiet_time_waits_its_own_turn() {
        let t0 = Instant::now();
        let mut s: Schedule<bool> = Schedule::new(t0);
        let mut freed = Vec::new();
        let later = t0 + Duration::from_secs(5);
        s.launched(0..1, false, later);
        assert_eq!(s.poll(later + 50 * MS, |&f| f, &mut freed), None);
        assert_eq!(s.poll(later + 100 * MS, |&f| f, &mut freed), Some(0..1));
    }

    fn call(seq: u64, count: u64) -> [u8; CALL_BYTES] {
        OpHeader {
            seq,
            kind: 0,
            dtype: crate::DataType::Float32 as u8,
            redop: 0,
            root: 0,
            count,
            plan: None,
        }
        .encode()
    }

    /// Ranks' call books in one process: `books[r]` is rank r's, by number.
    /// `me` answers for itself and asks the others, as the bootstrap would.
    struct Books {
        me: usize,
        books: Vec<Vec<[u8; CALL_BYTES]>>,
        remote: Mutex<Option<(usize, String)>>,
        failed: Mutex<Vec<(String, u64)>>,
        stopped: AtomicBool,
    }

    impl Books {
        fn new(me: usize, books: Vec<Vec<[u8; CALL_BYTES]>>) -> Books {
            Books {
                me,
                books,
                remote: Mutex::new(None),
                failed: Mutex::new(Vec::new()),
                stopped: AtomicBool::new(false),
            }
        }
    }

    impl Watched for Books {
        fn own_call(&self, seq: u64) -> Option<[u8; CALL_BYTES]> {
            self.books[self.me].get(seq as usize).copied()
        }
        fn ask(&self, peers: &[usize], seq: u64, _: Duration) -> Vec<(usize, PeerCall)> {
            peers
                .iter()
                .map(|&p| {
                    let b = &self.books[p];
                    let a = match b.get(seq as usize) {
                        Some(c) => PeerCall::Called(*c),
                        None => PeerCall::Started(b.len() as u64),
                    };
                    (p, a)
                })
                .collect()
        }
        fn remote_failure(&self) -> Option<(usize, String)> {
            self.remote.lock().unwrap().clone()
        }
        fn fail(&self, e: Error, seq: u64) -> Error {
            self.failed.lock().unwrap().push((e.to_string(), seq));
            self.stopped.store(true, Ordering::SeqCst);
            e
        }
    }

    #[test]
    fn a_peer_with_another_count_is_named() {
        // Collective #1: rank 0 called 1024 floats, rank 1 2048.
        let books = vec![
            vec![call(0, 8), call(1, 1024)],
            vec![call(0, 8), call(1, 2048)],
        ];
        let b = Books::new(0, books);
        compare(&b, 0..1, 0, 2, MS).unwrap();
        let e = compare(&b, 1..2, 0, 2, MS).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("mismatched counts: rank 0 called all_reduce #1 of 1024 x float, rank 1 of 2048 x float"),
            "{e}"
        );
    }

    #[test]
    fn a_peer_behind_is_compared_on_the_last_call_it_started() {
        // Rank 1 is still in #1 (rank 0 had a count of 0 there and went
        // on to #2): #1 is compared.
        let books = vec![
            vec![call(0, 8), call(1, 0), call(2, 8)],
            vec![call(0, 8), call(1, 4)],
        ];
        let e = compare(&Books::new(0, books), 2..3, 0, 2, MS).unwrap_err();
        assert!(
            e.to_string().contains("#1 of 0 x float, rank 1 of 4"),
            "{e}"
        );
    }

    struct Flag(Arc<AtomicBool>);
    impl Fence for Flag {
        fn finished(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn wait_for(what: impl Fn() -> bool, limit: Duration) -> Duration {
        let t = Instant::now();
        while !what() {
            assert!(t.elapsed() < limit, "not within {limit:?}");
            std::thread::sleep(MS);
        }
        t.elapsed()
    }

    /// The thread: finished work is never asked about; a stalled group
    /// whose peer called another count fails within a few ASK_AFTERs,
    /// naming it, and later launches are refused.
    #[test]
    fn the_thread_names_a_stalled_mismatch_and_stops_the_kernels() {
        let books = vec![
            vec![call(0, 8), call(1, 1024)],
            vec![call(0, 8), call(1, 2048)],
        ];
        let comm = Arc::new(Books::new(1, books));
        let w: DeviceWatch<Flag> = DeviceWatch::start(Arc::downgrade(&comm), 1, 2).unwrap();
        let done = Arc::new(AtomicBool::new(true));
        w.launched(0..1, Flag(done.clone()));
        std::thread::sleep(3 * ASK_AFTER);
        assert!(comm.failed.lock().unwrap().is_empty(), "finished work");
        assert!(w.failure().is_none());
        assert!(w.take_fence().is_some(), "the fence came back");
        let stuck = Arc::new(AtomicBool::new(false));
        w.launched(1..2, Flag(stuck.clone()));
        let took = wait_for(|| w.failure().is_some(), 10 * ASK_AFTER);
        assert!(took >= ASK_AFTER, "asked after {took:?}");
        assert!(comm.stopped.load(Ordering::SeqCst), "the kernels were told");
        let failed = comm.failed.lock().unwrap().clone();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].1, 1);
        assert!(failed[0].0.contains("mismatched counts"), "{}", failed[0].0);
        w.launched(2..3, Flag(stuck));
        assert!(
            w.take_fence().is_some(),
            "a launch after the failure is not watched"
        );
        w.close();
    }

    /// Counts whose kernels both ended (each rank's slices fit the
    /// other's): the finished group is compared with the next rank's call
    /// and the mismatch named all the same; equal calls stay quiet.
    #[test]
    fn a_mismatch_whose_kernels_ended_is_named_after_the_work() {
        let books = vec![
            vec![call(0, 8), call(1, 1024)],
            vec![call(0, 8), call(1, 2048)],
        ];
        let comm = Arc::new(Books::new(0, books));
        let w: DeviceWatch<Flag> = DeviceWatch::start(Arc::downgrade(&comm), 0, 2).unwrap();
        let done = Arc::new(AtomicBool::new(true));
        w.launched(0..1, Flag(done.clone()));
        std::thread::sleep(3 * ASK_AFTER);
        assert!(w.failure().is_none(), "equal calls");
        w.launched(1..2, Flag(done));
        wait_for(|| w.failure().is_some(), 10 * ASK_AFTER);
        let failed = comm.failed.lock().unwrap().clone();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].1, 1);
        assert!(failed[0].0.contains("mismatched counts"), "{}", failed[0].0);
        w.close();
    }

    #[test]
    fn a_finished_call_waits_for_the_next_rank_to_make_it() {
        let books = vec![vec![call(0, 8), call(1, 4)], vec![call(0, 8)]];
        let b = Books::new(0, books);
        assert!(!compare_done(&b, 1, 0, 2, MS).unwrap(), "rank 1 is behind");
        assert!(compare_done(&b, 0, 0, 2, MS).unwrap());
        // One rank, or a call no longer in the book: nothing to compare.
        assert!(compare_done(&b, 1, 0, 1, MS).unwrap());
        assert!(compare_done(&b, 7, 0, 2, MS).unwrap());
    }

    /// A peer that found a mismatch and failed may no longer answer: its
    /// notice fails this rank's finished work not yet compared.
    #[test]
    fn a_peer_failure_fails_finished_work_not_yet_compared() {
        let books = vec![vec![call(0, 8)], vec![]];
        let comm = Arc::new(Books::new(0, books));
        let w: DeviceWatch<Flag> = DeviceWatch::start(Arc::downgrade(&comm), 0, 2).unwrap();
        w.launched(0..1, Flag(Arc::new(AtomicBool::new(true))));
        std::thread::sleep(2 * ASK_AFTER);
        assert!(w.failure().is_none(), "rank 1 has not made the call");
        *comm.remote.lock().unwrap() = Some((1, "mismatched counts: ...".into()));
        wait_for(|| w.failure().is_some(), 10 * ASK_AFTER);
        let e = w.failure().unwrap().to_string();
        assert!(e.contains("rank 1 failed: mismatched counts"), "{e}");
        w.close();
    }

    /// A peer's failure notice ends the wait of a rank with work unfinished.
    #[test]
    fn a_peer_failure_ends_unfinished_work() {
        let books = vec![vec![call(0, 8)], vec![call(0, 8)]];
        let comm = Arc::new(Books::new(0, books));
        let w: DeviceWatch<Flag> = DeviceWatch::start(Arc::downgrade(&comm), 0, 2).unwrap();
        w.launched(0..1, Flag(Arc::new(AtomicBool::new(false))));
        *comm.remote.lock().unwrap() = Some((1, "mismatched counts: ...".into()));
        wait_for(|| w.failure().is_some(), 10 * ASK_AFTER);
        let e = w.failure().unwrap().to_string();
        assert!(e.contains("rank 1 failed: mismatched counts"), "{e}");
        w.close();
    }
}
