//! Connections between ranks: set up on first use (both ends reach the
//! same point of the same operation), kept for the communicator's life.
//!
//! Each peer is reached through one transport, chosen as NCCL chooses:
//! shared memory ([`shm`]) when the peer runs on this host (the same host
//! hash) with the same /dev/shm and neither rank set NCCL_SHM_DISABLE, else
//! the network (the net plugin). The choice depends only on what the ranks exchanged at
//! creation ([`Locality`]), so both ends of a connection make the same one.
//!
//! Every transport speaks the net plugin's interface, so connections are
//! made and driven one way: the receiver listens and sends its handle to
//! the sender through the bootstrap; both then poll `connect`/`accept`
//! together until done; the executor runs any of them alike.

pub mod cma;
pub mod gdr;
pub mod layout;
pub mod p2p;
pub mod proxy;
pub mod shm;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_plugin::{ListenComm, Net};
use tracing::info;

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::mem::reg::{RecvConn, SendConn};

/// Bootstrap tags of connection handles: one per (channel, purpose).
pub const TAG_CONN: u64 = 1 << 32;

/// A connection's place: channel (lane set) and peer rank.
pub type ConnKey = (usize, usize);

/// The channel of point-to-point connections, apart from the channels of
/// collectives.
pub const P2P_CHANNEL: usize = 1 << 16;

/// How a rank reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The peer's GPU memory, mapped (device buffers, same host, peer
    /// access): the device path's kernels store into it directly.
    P2p,
    /// Shared memory (same host): a ring for host buffers, a host area the
    /// GPUs store into for device buffers.
    Shm,
    /// The net plugin.
    Net,
}

/// What the ranks told each other at creation that decides how they connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locality {
    pub rank: usize,
    /// Each rank's host hash (NCCL_HOSTID, else host name and boot id).
    pub hosts: Vec<u64>,
    /// Each rank's /dev/shm device: containers of one host may each have
    /// their own.
    pub shm_devs: Vec<u64>,
    /// Ranks that set NCCL_SHM_DISABLE: a pair with either one in it does
    /// not use shared memory, whatever the other set.
    pub shm_disabled: Vec<usize>,
    /// Each rank's GPU, -1 for host memory: NCCL names a rank `rank[dev]`.
    pub devices: Vec<i32>,
}

impl Locality {
    /// The transport between this rank and `peer` (the same seen from
    /// either end).
    pub fn transport(&self, peer: usize) -> Transport {
        self.transport_between(self.rank, peer)
    }

    /// Whether every pair of ranks on one host, on every host, uses shared
    /// memory (the same answer on every rank).
    pub fn shm_on_every_host(&self) -> bool {
        let mut first: std::collections::HashMap<u64, usize> = Default::default();
        (0..self.hosts.len()).all(|r| {
            let a = *first.entry(self.hosts[r]).or_insert(r);
            a == r || self.transport_between(a, r) == Transport::Shm
        })
    }

    /// The transport between ranks `a` and `b`, as either sees it.
    fn transport_between(&self, a: usize, b: usize) -> Transport {
        let same_host =
            self.hosts.get(b) == self.hosts.get(a) && self.shm_devs.get(b) == self.shm_devs.get(a);
        let disabled = [a, b].iter().any(|r| self.shm_disabled.contains(r));
        if same_host && !disabled {
            Transport::Shm
        } else {
            Transport::Net
        }
    }

    /// The transport of the device path to `peer`: P2P between GPUs of one
    /// host unless `p2p` rules the pair out (NCCL_P2P_DISABLE on either
    /// rank, or a path beyond NCCL_P2P_LEVEL), else as host buffers go.
    /// The driver may still refuse the mapping (no peer access), which the
    /// window reports.
    pub fn device_transport(&self, peer: usize, p2p: &P2pPairs) -> Transport {
        self.device_transport_between(self.rank, peer, p2p)
    }

    /// The device path's transport between ranks `a` and `b`, as either
    /// sees it.
    pub fn device_transport_between(&self, a: usize, b: usize, p2p: &P2pPairs) -> Transport {
        let same_host = self.hosts.get(b) == self.hosts.get(a);
        if same_host && p2p.allows(a, b) {
            Transport::P2p
        } else {
            self.transport_between(a, b)
        }
    }

    /// `rank[dev]`, as NCCL's connection lines name a rank.
    pub fn who(&self, r: usize) -> String {
        format!("{r}[{}]", self.devices.get(r).copied().unwrap_or(-1))
    }
}

/// Which pairs of ranks may map each other's GPU memory: none with a rank
/// that set NCCL_P2P_DISABLE, and none that either end ruled out by its
/// NCCL_P2P_LEVEL (every rank knows every rank's verdicts, so both ends of
/// a pair, and every rank pricing the pair, choose alike).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct P2pPairs {
    disabled: Vec<usize>,
    /// (lower rank, higher rank).
    denied: std::collections::BTreeSet<(usize, usize)>,
}

impl P2pPairs {
    /// Only the ranks that set NCCL_P2P_DISABLE ruled out.
    pub fn disabled(ranks: &[usize]) -> P2pPairs {
        P2pPairs {
            disabled: ranks.to_vec(),
            denied: Default::default(),
        }
    }

    /// As [`P2pPairs::disabled`], and the pairs `(a, b)` that `a` refused
    /// (`verdicts[a][b]` false; ranks of other hosts are not asked).
    pub fn new(disabled: &[usize], verdicts: &[Vec<bool>]) -> P2pPairs {
        let mut p = P2pPairs::disabled(disabled);
        for (a, row) in verdicts.iter().enumerate() {
            for (b, ok) in row.iter().enumerate() {
                if !ok && a != b {
                    p.denied.insert((a.min(b), a.max(b)));
                }
            }
        }
        p
    }

    pub fn allows(&self, a: usize, b: usize) -> bool {
        !self.disabled.contains(&a)
            && !self.disabled.contains(&b)
            && !self.denied.contains(&(a.min(b), a.max(b)))
    }
}

/// One direction's connections, by channel and then peer. A collective's
/// lane takes its channel's whole map and gives it back (a swap, no
/// allocation per operation); point-to-point lanes take single peers.
pub struct ByChannel<C> {
    chans: BTreeMap<usize, BTreeMap<usize, C>>,
}

impl<C> Default for ByChannel<C> {
    fn default() -> Self {
        ByChannel {
            chans: BTreeMap::new(),
        }
    }
}

impl<C> ByChannel<C> {
    pub fn contains(&self, (chan, peer): ConnKey) -> bool {
        self.chans.get(&chan).is_some_and(|m| m.contains_key(&peer))
    }

    pub fn insert(&mut self, (chan, peer): ConnKey, c: C) {
        self.chans.entry(chan).or_default().insert(peer, c);
    }

    /// Every connection of `chan`, leaving an empty map in its place.
    pub fn take_channel(&mut self, chan: usize) -> BTreeMap<usize, C> {
        self.chans
            .get_mut(&chan)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn take(&mut self, (chan, peer): ConnKey) -> Option<C> {
        self.chans.get_mut(&chan)?.remove(&peer)
    }

    /// Gives back what [`ByChannel::take_channel`] or [`ByChannel::take`]
    /// took from `chan`.
    pub fn put_back(&mut self, chan: usize, conns: BTreeMap<usize, C>) {
        let m = self.chans.entry(chan).or_default();
        if m.is_empty() {
            *m = conns;
        } else {
            m.extend(conns);
        }
    }

    pub fn clear(&mut self) {
        self.chans.clear();
    }
}

/// All connections of one communicator, each with the memory registered
/// through it.
pub struct Connections {
    pub send: ByChannel<SendConn>,
    pub recv: ByChannel<RecvConn>,
    net: Arc<dyn Net>,
    shm: shm::ShmNet,
    local: Locality,
    nics: Option<NicPlan>,
}

/// Which network device each rank's channels take: its GPU's nearest
/// NICs under NCCL_NETDEVS_POLICY, in turn by channel, and on the
/// receiving end the sender's rail or its own as NCCL_CROSS_NIC says
/// (see [`crate::topo::policy`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NicPlan {
    /// Each rank's devices (channel `c` takes entry `c % len`), worked out
    /// on this node for every rank's GPU (NCCL's assumption that nodes
    /// are alike); empty where unknown: channel `c` takes device `c % n`.
    pub by_rank: Vec<Vec<usize>>,
    /// This rank's GPU's nearest devices.
    pub local: Vec<usize>,
    pub cross: crate::topo::policy::CrossNic,
}

impl NicPlan {
    fn dev_of(&self, rank: usize, chan: usize, ndev: usize) -> Option<usize> {
        let v = self.by_rank.get(rank).filter(|v| !v.is_empty())?;
        Some(v[chan % v.len()]).filter(|d| *d < ndev)
    }

    /// The device rank `me` sends from on channel `chan`.
    pub fn send_dev(&self, me: usize, chan: usize, ndev: usize) -> usize {
        self.dev_of(me, chan, ndev).unwrap_or(chan % ndev)
    }

    /// The device rank `me` receives from `sender` on, on channel `chan`.
    pub fn recv_dev(&self, me: usize, sender: usize, chan: usize, ndev: usize) -> usize {
        let own = self.send_dev(me, chan, ndev);
        let theirs = self.dev_of(sender, chan, ndev);
        crate::topo::policy::receive_dev(self.cross, theirs, own, &self.local, ndev)
    }
}

impl Connections {
    pub fn new(net: Arc<dyn Net>, shm: shm::ShmNet, local: Locality) -> Connections {
        Connections {
            send: ByChannel::default(),
            recv: ByChannel::default(),
            net,
            shm,
            local,
            nics: None,
        }
    }

    /// Network devices by GPU instead of by channel alone.
    pub fn with_nics(mut self, plan: NicPlan) -> Connections {
        self.nics = Some(plan);
        self
    }

    /// The transport of `key` and the device of it to use: the net's
    /// devices taken in turn by channel, by the [`NicPlan`] where there is
    /// one (`send`: this rank sends on the connection).
    fn route(
        &self,
        key: ConnKey,
        send: bool,
        ndev: &mut Option<usize>,
    ) -> Result<(&dyn Net, usize)> {
        match self.local.transport(key.1) {
            Transport::P2p => Err(Error::Internal(format!(
                "a network connection asked for P2P peer {}",
                key.1
            ))),
            Transport::Shm => Ok((&self.shm, 0)),
            Transport::Net => {
                let n = match *ndev {
                    Some(n) => n,
                    None => *ndev.insert(self.net.devices()?.max(1)),
                };
                let me = self.local.rank;
                let dev = match &self.nics {
                    Some(p) if send => p.send_dev(me, key.0, n),
                    Some(p) => p.recv_dev(me, key.1, key.0, n),
                    None => key.0 % n,
                };
                Ok((&*self.net, dev))
            }
        }
    }

    /// NCCL's INFO line for a connection made (its formats of 2.18-2.29:
    /// SHM logs the send side only; NET logs both, with the channel's
    /// connection index, 1 for point-to-point).
    fn log(&self, key: ConnKey, send: bool, dev: usize) {
        let (chan, conn) = if key.0 == P2P_CHANNEL {
            (0, 1)
        } else {
            (key.0, 0)
        };
        let (me, peer) = (self.local.who(self.local.rank), self.local.who(key.1));
        match (self.local.transport(key.1), send) {
            (Transport::Shm, true) => {
                info!(target: "oxccl::init", "Channel {chan:02} : {me} -> {peer} via SHM/direct/direct")
            }
            (Transport::Shm | Transport::P2p, false) => {}
            (Transport::P2p, true) => {
                info!(target: "oxccl::init", "Channel {chan:02} : {me} -> {peer} via P2P/direct")
            }
            (Transport::Net, true) => info!(target: "oxccl::init",
                "Channel {chan:02}/{conn} : {me} -> {peer} [send] via NET/{}/{dev}", self.net.name()),
            (Transport::Net, false) => info!(target: "oxccl::init",
                "Channel {chan:02}/{conn} : {peer} -> {me} [receive] via NET/{}/{dev}", self.net.name()),
        }
    }

    /// Takes the connections of `peers` on channels `chans` out, both
    /// directions of each pair together (the device path's proxy drives
    /// them from then on).
    pub fn take_links(&mut self, peers: &[usize], chans: &[usize]) -> Result<Vec<proxy::Link>> {
        let mut links = Vec::new();
        for &peer in peers {
            for &chan in chans {
                let (send, recv) = (self.send.take((chan, peer)), self.recv.take((chan, peer)));
                let (Some(send), Some(recv)) = (send, recv) else {
                    return Err(Error::Internal(format!(
                        "no connection to rank {peer} on channel {chan}"
                    )));
                };
                links.push(proxy::Link {
                    peer,
                    chan,
                    send,
                    recv,
                });
            }
        }
        Ok(links)
    }

    /// Establishes the missing connections among `sends` and `recvs`;
    /// gives up at `timeout`, or as soon as `stopped` returns an error (a
    /// revoke or an abort of the communicator).
    pub fn ensure(
        &mut self,
        bootstrap: &Bootstrap,
        sends: &[ConnKey],
        recvs: &[ConnKey],
        timeout: Duration,
        stopped: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let mut ndev = None;
        let mut listens: Vec<(ConnKey, usize, Box<dyn ListenComm>)> = Vec::new();
        for &key in recvs {
            if self.recv.contains(key) || listens.iter().any(|(k, ..)| *k == key) {
                continue;
            }
            let (net, dev) = self.route(key, false, &mut ndev)?;
            let (handle, listen) = net
                .listen(dev)
                .map_err(|e| Error::from(e).context(format!("listening for rank {}", key.1)))?;
            bootstrap.send(key.1, TAG_CONN + key.0 as u64, &handle)?;
            listens.push((key, dev, listen));
        }
        let mut connects: Vec<(ConnKey, usize, oxccl_plugin::NetHandle)> = Vec::new();
        for &key in sends {
            if self.send.contains(key) || connects.iter().any(|(k, ..)| *k == key) {
                continue;
            }
            let dev = self.route(key, true, &mut ndev)?.1;
            let bytes = bootstrap.recv(key.1, TAG_CONN + key.0 as u64)?;
            let mut handle = [0u8; oxccl_plugin::NET_HANDLE_MAXSIZE];
            if bytes.len() != handle.len() {
                return Err(Error::Internal(format!(
                    "rank {} sent a {}-byte connection handle",
                    key.1,
                    bytes.len()
                )));
            }
            handle.copy_from_slice(&bytes);
            connects.push((key, dev, handle));
        }
        let start = Instant::now();
        while !(listens.is_empty() && connects.is_empty()) {
            // Connects before accepts, in the order NCCL's transport setup
            // takes (every send's connect, then every receive's): plugins
            // written for NCCL may rely on it. Google's Fast Socket blocks in
            // accept until the peer's connect has started its connections,
            // while its connect only starts a thread; accepting first left
            // both ranks of a pair blocked in accept.
            let mut i = 0;
            while i < connects.len() {
                let (key, dev, h) = &mut connects[i];
                let (key, dev) = (*key, *dev);
                let net = self.route(key, true, &mut ndev)?.0;
                match net
                    .connect(dev, h)
                    .map_err(|e| Error::from(e).context(format!("connecting to rank {}", key.1)))?
                {
                    Some(c) => {
                        self.send.insert(key, SendConn::new(c));
                        connects.swap_remove(i);
                        self.log(key, true, dev);
                    }
                    None => i += 1,
                }
            }
            let mut i = 0;
            while i < listens.len() {
                let (key, dev, l) = &mut listens[i];
                match l
                    .accept()
                    .map_err(|e| Error::from(e).context(format!("accepting rank {}", key.1)))?
                {
                    Some(c) => {
                        let (key, dev) = (*key, *dev);
                        self.recv.insert(key, RecvConn::new(c));
                        listens.swap_remove(i);
                        self.log(key, false, dev);
                    }
                    None => i += 1,
                }
            }
            if let Some(e) = stopped() {
                return Err(e);
            }
            // As the bootstrap's own waits: a peer that failed (and may
            // have left) never completes its side.
            if let Some((who, msg)) = bootstrap.remote_failure() {
                return Err(Error::Remote(format!("rank {who} failed: {msg}")));
            }
            if start.elapsed() > timeout {
                let peers: Vec<usize> = listens
                    .iter()
                    .map(|(k, ..)| k.1)
                    .chain(connects.iter().map(|(k, ..)| k.1))
                    .collect();
                return Err(Error::Remote(format!(
                    "connections to ranks {peers:?} not established within {:.1} s (NCCL_TIMEOUT)",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rank: usize, shm_disabled: &[usize]) -> Locality {
        Locality {
            rank,
            hosts: vec![7, 7, 9],
            shm_devs: vec![5, 5, 5],
            shm_disabled: shm_disabled.to_vec(),
            devices: vec![-1, 0, 1],
        }
    }

    /// Every rank gives the same answer, from the whole layout: a rank
    /// alone on its host (2) judging only its own host would say yes
    /// where its peers on host 7 say no.
    #[test]
    fn shared_memory_on_every_host_is_judged_alike_everywhere() {
        for (disabled, want) in [
            (&[][..], true),
            (&[2], true),
            (&[1], false),
            (&[0, 1], false),
        ] {
            for r in 0..3 {
                assert_eq!(
                    at(r, disabled).shm_on_every_host(),
                    want,
                    "{disabled:?} at {r}"
                );
            }
        }
        let containers = Locality {
            shm_devs: vec![5, 6, 5],
            ..at(2, &[])
        };
        assert!(!containers.shm_on_every_host());
    }

    /// Channels take each GPU's NICs in turn; the receiver follows the
    /// sender's rail under NCCL_CROSS_NIC=0 and keeps its own under 1.
    #[test]
    fn nic_plan_by_gpu_and_rail() {
        use crate::topo::policy::CrossNic;
        let plan = |cross| NicPlan {
            by_rank: vec![vec![0], vec![1, 3], vec![]],
            local: vec![0],
            cross,
        };
        let p = plan(CrossNic::Allow);
        assert_eq!(p.send_dev(0, 5, 4), 0);
        assert_eq!(p.send_dev(1, 0, 4), 1);
        assert_eq!(p.send_dev(1, 1, 4), 3);
        // Unknown GPU: by channel, as without a plan.
        assert_eq!(p.send_dev(2, 5, 4), 1);
        // Rank 0 receiving from rank 1 on channel 1 (sent from NIC 3).
        assert_eq!(p.recv_dev(0, 1, 1, 4), 0);
        assert_eq!(plan(CrossNic::Never).recv_dev(0, 1, 1, 4), 3);
        assert_eq!(plan(CrossNic::Prefer).recv_dev(0, 1, 1, 4), 0);
        // A device the network does not have is not taken.
        assert_eq!(plan(CrossNic::Never).recv_dev(0, 1, 1, 2), 0);
    }

    /// NCCL_P2P_LEVEL's verdicts: a pair that either end refused goes
    /// through shared memory, seen alike from both ends.
    #[test]
    fn p2p_verdicts_rule_out_pairs_from_either_end() {
        let l = |rank| Locality {
            rank,
            hosts: vec![7, 7, 7],
            shm_devs: vec![5, 5, 5],
            shm_disabled: Vec::new(),
            devices: vec![0, 1, 2],
        };
        // Rank 1 refuses rank 2 (say PHB beyond its level); rank 2 does not.
        let rows = vec![vec![true; 3], vec![true, true, false], vec![true; 3]];
        let p = P2pPairs::new(&[], &rows);
        assert_eq!(l(1).device_transport(2, &p), Transport::Shm);
        assert_eq!(l(2).device_transport(1, &p), Transport::Shm);
        assert_eq!(l(0).device_transport(2, &p), Transport::P2p);
        assert_eq!(l(0).device_transport(1, &p), Transport::P2p);
        // NCCL_P2P_DISABLE on rank 0 rules out its pairs as before.
        let p = P2pPairs::new(&[0], &rows);
        assert_eq!(l(1).device_transport(0, &p), Transport::Shm);
        assert!(P2pPairs::default().allows(0, 1));
    }

    /// Ranks 0 and 1 share a host, rank 2 is alone; whatever is disabled
    /// where, the two ends of every pair choose alike.
    #[test]
    fn both_ends_of_a_pair_choose_alike() {
        for disabled in [&[][..], &[0], &[1], &[2], &[0, 1]] {
            for a in 0..3 {
                for b in (0..3).filter(|b| *b != a) {
                    assert_eq!(
                        at(a, disabled).transport(b),
                        at(b, disabled).transport(a),
                        "{a}-{b} with {disabled:?} disabled"
                    );
                }
            }
        }
        assert_eq!(at(0, &[]).transport(1), Transport::Shm);
        assert_eq!(at(0, &[2]).transport(1), Transport::Shm);
        assert_eq!(at(0, &[]).transport(2), Transport::Net);
        assert_eq!(at(1, &[0]).transport(0), Transport::Net);
        assert_eq!(at(2, &[]).who(1), "1[0]");
        // One host, but rank 1 in a container with a /dev/shm of its own.
        let mut apart = at(0, &[]);
        apart.shm_devs[1] = 6;
        assert_eq!(apart.transport(1), Transport::Net);
    }
}
