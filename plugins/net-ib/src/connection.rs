//! Connection set-up, sans-IO: the connector and the acceptor exchange
//! their queue pairs' numbers and addresses over a TCP socket, as NCCL's IB
//! transport does, then each moves its QPs to ready-to-send. The two state
//! machines below take events (socket connected, bytes read, socket
//! closed, QPs brought up) and return what to do (bytes to write, QPs to
//! bring up, done); `listen.rs` and `lib.rs` do the I/O. They never block
//! and are tested here against each other with no socket and no device.
//!
//! Order, as NCCL's: the connector sends its hello; the acceptor brings its
//! QPs to RTR/RTS toward the connector's and answers with its own hello;
//! the connector brings its QPs up and sends "ready". The acceptor returns
//! its receive end only after "ready", so neither side sends before the
//! other's QPs can receive.
//!
//! Both machines are bounded in time: they are given a [`Deadline`] and
//! the current time (`tick`), and a peer that stops answering ends the
//! set-up with an error naming it and the setting that bounds the wait.
//!
//! Also here: the QP attributes of each transition, computed from the
//! local port, the remote QP and the settings (pure, tested).

use std::time::{Duration, Instant};

use oxccl_plugin::NetError;

use crate::config::{Config, CONNECT_TIMEOUT_KEY, MAX_QPS};
use crate::verbs::{self, IbvQpAttr, IBV_LINK_LAYER_ETHERNET};

const WIRE_MAGIC: u32 = 0x4f58_4951; // "OXIQ"
const WIRE_VERSION: u8 = 1;
const KIND_HELLO: u8 = 1;
const KIND_READY: u8 = 2;
const HEADER: usize = 16;
const QP_ENTRY: usize = 24;
/// Every hello has the same size, whatever its QP count, so a reader knows
/// how many bytes to wait for.
pub const HELLO_LEN: usize = HEADER + MAX_QPS * QP_ENTRY;
pub const READY_LEN: usize = HEADER;

/// What the peer needs to reach one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpInfo {
    pub qpn: u32,
    pub lid: u16,
    pub link_layer: u8,
    /// `enum ibv_mtu` of the port (1 = 256 … 5 = 4096).
    pub mtu: u8,
    pub gid: [u8; 16],
}

/// One side's QPs, in connection order (QP i pairs with the peer's QP i).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub magic: u64,
    pub qps: Vec<QpInfo>,
}

fn header(kind: u8, nqps: u8, magic: u64) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    b[0..4].copy_from_slice(&WIRE_MAGIC.to_le_bytes());
    b[4] = WIRE_VERSION;
    b[5] = kind;
    b[6] = nqps;
    b[8..16].copy_from_slice(&magic.to_le_bytes());
    b
}

fn proto(why: String) -> NetError {
    NetError::Remote(format!("IB connection set-up: {why}"))
}

fn parse_header(b: &[u8], kind: u8, magic: u64) -> Result<u8, NetError> {
    if b.len() < HEADER || u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != WIRE_MAGIC {
        return Err(proto(
            "the peer is not an oxccl IB endpoint (bad magic)".into(),
        ));
    }
    if b[4] != WIRE_VERSION {
        return Err(proto(format!(
            "the peer speaks set-up version {}, this library {WIRE_VERSION}",
            b[4]
        )));
    }
    if b[5] != kind {
        return Err(proto(format!("expected message kind {kind}, got {}", b[5])));
    }
    let mut m = [0u8; 8];
    m.copy_from_slice(&b[8..16]);
    if u64::from_le_bytes(m) != magic {
        return Err(proto(
            "the peer presented another connection's magic (stale or foreign handle)".into(),
        ));
    }
    Ok(b[6])
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HELLO_LEN];
        b[..HEADER].copy_from_slice(&header(KIND_HELLO, self.qps.len() as u8, self.magic));
        for (i, q) in self.qps.iter().enumerate() {
            let e = &mut b[HEADER + i * QP_ENTRY..HEADER + (i + 1) * QP_ENTRY];
            e[0..4].copy_from_slice(&q.qpn.to_le_bytes());
            e[4..6].copy_from_slice(&q.lid.to_le_bytes());
            e[6] = q.link_layer;
            e[7] = q.mtu;
            e[8..24].copy_from_slice(&q.gid);
        }
        b
    }

    pub fn decode(b: &[u8], magic: u64) -> Result<Hello, NetError> {
        let n = parse_header(b, KIND_HELLO, magic)? as usize;
        if n == 0 || n > MAX_QPS || b.len() != HELLO_LEN {
            return Err(proto(format!("hello with {n} QPs and {} bytes", b.len())));
        }
        let qps = (0..n)
            .map(|i| {
                let e = &b[HEADER + i * QP_ENTRY..HEADER + (i + 1) * QP_ENTRY];
                let mut gid = [0u8; 16];
                gid.copy_from_slice(&e[8..24]);
                QpInfo {
                    qpn: u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                    lid: u16::from_le_bytes([e[4], e[5]]),
                    link_layer: e[6],
                    mtu: e[7],
                    gid,
                }
            })
            .collect();
        Ok(Hello { magic, qps })
    }
}

/// What a state machine asks its I/O layer to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write these bytes (after any not yet written).
    Write(Vec<u8>),
    /// Move the local QPs to RTR/RTS toward these remote QPs, then call
    /// `brought_up`.
    BringUp(Hello),
    /// Set-up is over once every byte asked for is written.
    Established,
}

/// When a set-up must be over, and whom it waits for.
#[derive(Debug, Clone)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
    peer: String,
}

impl Deadline {
    /// `limit` from `start`; `peer` is the address named in the error.
    pub fn new(start: Instant, limit: Duration, peer: String) -> Deadline {
        Deadline {
            at: start + limit,
            limit,
            peer,
        }
    }

    fn check(&self, now: Instant, what: &str, waiting_for: &str) -> Result<(), NetError> {
        if now < self.at {
            return Ok(());
        }
        Err(NetError::Remote(format!(
            "IB {what} {}: set-up not finished after {} s, still waiting for {waiting_for} \
             (the wait is bounded by {CONNECT_TIMEOUT_KEY}={}; is the peer rank alive and \
             its address reachable from here?)",
            self.peer,
            self.limit.as_secs(),
            self.limit.as_secs()
        )))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CState {
    Connecting,
    AwaitHello,
    AwaitBringUp,
    Done,
}

/// The connecting side. Its QPs exist (in INIT) before it starts, so its
/// hello is known up front.
#[derive(Debug)]
pub struct Connector {
    state: CState,
    local: Hello,
    inbuf: Vec<u8>,
    deadline: Deadline,
}

impl Connector {
    pub fn new(local: Hello, deadline: Deadline) -> Connector {
        Connector {
            state: CState::Connecting,
            local,
            inbuf: Vec::new(),
            deadline,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == CState::Done
    }

    /// The time is `now`: an error once the deadline passed before set-up ended.
    pub fn tick(&self, now: Instant) -> Result<(), NetError> {
        let waiting_for = match self.state {
            CState::Done => return Ok(()),
            CState::Connecting => "the TCP connection to its listener",
            CState::AwaitHello => "its queue pairs (hello)",
            CState::AwaitBringUp => "this side's queue pairs to come up",
        };
        self.deadline.check(now, "connect to", waiting_for)
    }

    /// The TCP connection is up: say who we are.
    pub fn connected(&mut self) -> Result<Vec<Action>, NetError> {
        if self.state != CState::Connecting {
            return Err(NetError::Internal(format!(
                "connected() in state {:?}",
                self.state
            )));
        }
        self.state = CState::AwaitHello;
        Ok(vec![Action::Write(self.local.encode())])
    }

    /// Bytes read from the socket (any split).
    pub fn received(&mut self, bytes: &[u8]) -> Result<Vec<Action>, NetError> {
        if self.state != CState::AwaitHello {
            return Err(proto(format!(
                "{} unexpected bytes from the acceptor",
                bytes.len()
            )));
        }
        self.inbuf.extend_from_slice(bytes);
        if self.inbuf.len() < HELLO_LEN {
            return Ok(Vec::new());
        }
        if self.inbuf.len() > HELLO_LEN {
            return Err(proto("the acceptor sent more than its hello".into()));
        }
        let remote = Hello::decode(&self.inbuf, self.local.magic)?;
        if remote.qps.len() != self.local.qps.len() {
            return Err(proto(format!(
                "the acceptor has {} QPs, this side {}",
                remote.qps.len(),
                self.local.qps.len()
            )));
        }
        self.state = CState::AwaitBringUp;
        Ok(vec![Action::BringUp(remote)])
    }

    pub fn brought_up(&mut self) -> Result<Vec<Action>, NetError> {
        if self.state != CState::AwaitBringUp {
            return Err(NetError::Internal(format!(
                "brought_up() in state {:?}",
                self.state
            )));
        }
        self.state = CState::Done;
        Ok(vec![
            Action::Write(header(KIND_READY, 0, self.local.magic).to_vec()),
            Action::Established,
        ])
    }

    /// The socket closed (EOF or error) before set-up ended.
    pub fn closed(&self) -> NetError {
        proto(format!(
            "the acceptor closed the socket while this side was in {:?}",
            self.state
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AState {
    AwaitHello,
    AwaitBringUp,
    AwaitReady,
    Done,
}

/// The accepting side. It creates its QPs once it knows the connector's
/// count (from the hello), so its own hello comes with `brought_up`.
#[derive(Debug)]
pub struct Acceptor {
    state: AState,
    magic: u64,
    inbuf: Vec<u8>,
    deadline: Deadline,
}

impl Acceptor {
    /// Made when the connector's TCP connection arrives; the deadline
    /// bounds the rest of the set-up.
    pub fn new(magic: u64, deadline: Deadline) -> Acceptor {
        Acceptor {
            state: AState::AwaitHello,
            magic,
            inbuf: Vec::new(),
            deadline,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == AState::Done
    }

    /// As [`Connector::tick`]: a connector that goes quiet must not hold
    /// the listener forever.
    pub fn tick(&self, now: Instant) -> Result<(), NetError> {
        let waiting_for = match self.state {
            AState::Done => return Ok(()),
            AState::AwaitHello => "its queue pairs (hello)",
            AState::AwaitBringUp => "this side's queue pairs to come up",
            AState::AwaitReady => "its \"ready\"",
        };
        self.deadline.check(now, "accept from", waiting_for)
    }

    pub fn received(&mut self, bytes: &[u8]) -> Result<Vec<Action>, NetError> {
        let want = match self.state {
            AState::AwaitHello => HELLO_LEN,
            AState::AwaitReady => READY_LEN,
            s => {
                return Err(proto(format!(
                    "{} unexpected bytes from the connector in state {s:?}",
                    bytes.len()
                )))
            }
        };
        self.inbuf.extend_from_slice(bytes);
        if self.inbuf.len() < want {
            return Ok(Vec::new());
        }
        if self.inbuf.len() > want {
            return Err(proto("the connector sent more than expected".into()));
        }
        let msg = std::mem::take(&mut self.inbuf);
        if self.state == AState::AwaitHello {
            let remote = Hello::decode(&msg, self.magic)?;
            self.state = AState::AwaitBringUp;
            Ok(vec![Action::BringUp(remote)])
        } else {
            parse_header(&msg, KIND_READY, self.magic)?;
            self.state = AState::Done;
            Ok(vec![Action::Established])
        }
    }

    /// The local QPs (as many as the connector's) are up; `local` describes them.
    pub fn brought_up(&mut self, local: &Hello) -> Result<Vec<Action>, NetError> {
        if self.state != AState::AwaitBringUp {
            return Err(NetError::Internal(format!(
                "brought_up() in state {:?}",
                self.state
            )));
        }
        self.state = AState::AwaitReady;
        let mut h = local.clone();
        h.magic = self.magic;
        Ok(vec![Action::Write(h.encode())])
    }

    pub fn closed(&self) -> NetError {
        proto(format!(
            "the connector closed the socket while this side was in {:?}",
            self.state
        ))
    }
}

/// The local end of one QP: the port it lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    pub port: u8,
    pub link_layer: u8,
    pub mtu: u8,
    pub gid_index: i32,
}

/// RESET → INIT: the port, the partition, and what the peer may do to our
/// memory (write and read: the flush reads).
pub fn init_attr(local: &LocalPort, cfg: &Config) -> (IbvQpAttr, i32) {
    let a = IbvQpAttr {
        qp_state: verbs::IBV_QPS_INIT,
        pkey_index: cfg.pkey_index,
        port_num: local.port,
        qp_access_flags: verbs::IBV_ACCESS_LOCAL_WRITE
            | verbs::IBV_ACCESS_REMOTE_WRITE
            | verbs::IBV_ACCESS_REMOTE_READ,
        ..IbvQpAttr::default()
    };
    let mask = verbs::IBV_QP_STATE
        | verbs::IBV_QP_PKEY_INDEX
        | verbs::IBV_QP_PORT
        | verbs::IBV_QP_ACCESS_FLAGS;
    (a, mask)
}

/// INIT → RTR toward `remote`: on RoCE the route is the GID (global
/// header with NCCL_IB_TC), on InfiniBand the LID; NCCL_IB_SL either way.
pub fn rtr_attr(local: &LocalPort, remote: &QpInfo, cfg: &Config) -> (IbvQpAttr, i32) {
    let mut a = IbvQpAttr {
        qp_state: verbs::IBV_QPS_RTR,
        path_mtu: local.mtu.min(remote.mtu).max(1) as i32,
        dest_qp_num: remote.qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        // 12: 0.64 ms before an RNR retry, NCCL's value.
        min_rnr_timer: 12,
        ..IbvQpAttr::default()
    };
    a.ah_attr.sl = cfg.service_level;
    a.ah_attr.port_num = local.port;
    if local.link_layer == IBV_LINK_LAYER_ETHERNET {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = remote.gid;
        a.ah_attr.grh.sgid_index = local.gid_index as u8;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = cfg.traffic_class;
    } else {
        a.ah_attr.dlid = remote.lid;
    }
    let mask = verbs::IBV_QP_STATE
        | verbs::IBV_QP_AV
        | verbs::IBV_QP_PATH_MTU
        | verbs::IBV_QP_DEST_QPN
        | verbs::IBV_QP_RQ_PSN
        | verbs::IBV_QP_MAX_DEST_RD_ATOMIC
        | verbs::IBV_QP_MIN_RNR_TIMER;
    (a, mask)
}

/// RTR → RTS: NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT; RNR retries unbounded
/// (7), because a send may arrive before its receive is posted.
pub fn rts_attr(cfg: &Config) -> (IbvQpAttr, i32) {
    let a = IbvQpAttr {
        qp_state: verbs::IBV_QPS_RTS,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..IbvQpAttr::default()
    };
    let mask = verbs::IBV_QP_STATE
        | verbs::IBV_QP_TIMEOUT
        | verbs::IBV_QP_RETRY_CNT
        | verbs::IBV_QP_RNR_RETRY
        | verbs::IBV_QP_SQ_PSN
        | verbs::IBV_QP_MAX_QP_RD_ATOMIC;
    (a, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline no test reaches.
    fn far() -> Deadline {
        Deadline::new(Instant::now(), Duration::from_secs(3600), "peer".into())
    }

    fn hello(magic: u64, n: usize, base: u32) -> Hello {
        Hello {
            magic,
            qps: (0..n)
                .map(|i| QpInfo {
                    qpn: base + i as u32,
                    lid: 7,
                    link_layer: 1,
                    mtu: 5,
                    gid: [i as u8; 16],
                })
                .collect(),
        }
    }

    /// Runs both machines against each other, delivering written bytes in
    /// pieces of `chunk`; returns what each side was asked to bring up.
    fn run(chunk: usize, nqps: usize) -> (Hello, Hello) {
        let magic = 0xfeed;
        let mut c = Connector::new(hello(magic, nqps, 100), far());
        let mut a = Acceptor::new(magic, far());
        let (mut to_a, mut to_c) = (Vec::<u8>::new(), Vec::<u8>::new());
        let (mut c_up, mut a_up) = (None, None);
        let (mut c_est, mut a_est) = (false, false);
        let mut a_brought = false;
        let mut pending_c = c.connected().unwrap();
        let mut pending_a = Vec::new();
        for _ in 0..10_000 {
            for act in pending_c.drain(..) {
                match act {
                    Action::Write(b) => to_a.extend(b),
                    Action::BringUp(h) => c_up = Some(h),
                    Action::Established => c_est = true,
                }
            }
            for act in pending_a.drain(..) {
                match act {
                    Action::Write(b) => to_c.extend(b),
                    Action::BringUp(h) => a_up = Some(h),
                    Action::Established => a_est = true,
                }
            }
            if c_est && a_est {
                break;
            }
            if !to_a.is_empty() {
                let n = chunk.min(to_a.len());
                let piece: Vec<u8> = to_a.drain(..n).collect();
                pending_a = a.received(&piece).unwrap();
            } else if !to_c.is_empty() {
                let n = chunk.min(to_c.len());
                let piece: Vec<u8> = to_c.drain(..n).collect();
                pending_c = c.received(&piece).unwrap();
            } else if a_up.is_some() && !a_brought {
                a_brought = true;
                pending_a = a.brought_up(&hello(0, nqps, 200)).unwrap();
            } else if c_up.is_some() && !c.is_done() {
                pending_c = c.brought_up().unwrap();
            }
        }
        assert!(c.is_done() && a.is_done() && c_est && a_est);
        (c_up.unwrap(), a_up.unwrap())
    }

    #[test]
    fn connector_and_acceptor_agree_whatever_the_byte_split() {
        for chunk in [1, 3, 16, HELLO_LEN, 10_000] {
            for nqps in [1, 4, MAX_QPS] {
                let (c_saw, a_saw) = run(chunk, nqps);
                assert_eq!(c_saw, hello(0xfeed, nqps, 200), "chunk {chunk}");
                assert_eq!(a_saw, hello(0xfeed, nqps, 100), "chunk {chunk}");
            }
        }
    }

    #[test]
    fn strangers_and_breakage_are_errors() {
        // Another connection's magic.
        let mut a = Acceptor::new(1, far());
        let e = a.received(&hello(2, 1, 0).encode()).unwrap_err();
        assert!(
            matches!(e, NetError::Remote(_)) && e.to_string().contains("magic"),
            "{e}"
        );
        // Not our protocol at all.
        let mut a = Acceptor::new(1, far());
        assert!(a.received(&[b'G'; HELLO_LEN]).is_err());
        // Too many bytes.
        let mut a = Acceptor::new(1, far());
        let mut b = hello(1, 1, 0).encode();
        b.push(0);
        assert!(a.received(&b).is_err());
        // QP count disagreement.
        let mut c = Connector::new(hello(1, 2, 0), far());
        c.connected().unwrap();
        let e = c.received(&hello(1, 3, 0).encode()).unwrap_err();
        assert!(e.to_string().contains("3 QPs"), "{e}");
        // Events out of order are internal errors, not panics.
        let mut c = Connector::new(hello(1, 1, 0), far());
        assert!(c.brought_up().is_err());
        assert!(c.received(&[0]).is_err());
        assert!(Acceptor::new(1, far()).brought_up(&hello(1, 1, 0)).is_err());
        assert!(c.closed().to_string().contains("closed"));
    }

    /// A peer that never answers: the machines are fed time, not slept on.
    #[test]
    fn a_silent_peer_ends_in_an_error_naming_it_and_the_setting() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(20);
        let s = |n: u64| t0 + Duration::from_secs(n);
        let dl = || Deadline::new(t0, limit, "10.0.0.7:4242".into());

        // TCP connection never completes.
        let c = Connector::new(hello(1, 1, 0), dl());
        c.tick(s(19)).unwrap();
        let e = c.tick(s(20)).unwrap_err();
        let t = e.to_string();
        assert!(matches!(e, NetError::Remote(_)), "{t}");
        assert!(
            t.contains("10.0.0.7:4242")
                && t.contains("OXCCL_IB_CONNECT_TIMEOUT=20")
                && t.contains("TCP connection"),
            "{t}"
        );

        // Connected, hello sent, the acceptor never answers.
        let mut c = Connector::new(hello(1, 1, 0), dl());
        c.connected().unwrap();
        c.tick(s(5)).unwrap();
        let t = c.tick(s(21)).unwrap_err().to_string();
        assert!(
            t.contains("hello") && t.contains("connect to 10.0.0.7"),
            "{t}"
        );

        // The acceptor side: a connector that stops after half a hello.
        let mut a = Acceptor::new(1, dl());
        let h = hello(1, 1, 0).encode();
        assert!(a.received(&h[..10]).unwrap().is_empty());
        a.tick(s(19)).unwrap();
        let t = a.tick(s(20)).unwrap_err().to_string();
        assert!(
            t.contains("accept from 10.0.0.7:4242") && t.contains("OXCCL_IB_CONNECT_TIMEOUT"),
            "{t}"
        );

        // ... or never says "ready".
        let mut a = Acceptor::new(1, dl());
        a.received(&h).unwrap();
        a.brought_up(&hello(0, 1, 9)).unwrap();
        let t = a.tick(s(30)).unwrap_err().to_string();
        assert!(t.contains("ready"), "{t}");
    }

    /// Time is no error once set-up is over: the deadline only bounds it.
    #[test]
    fn a_finished_setup_ignores_the_deadline() {
        let t0 = Instant::now();
        let dl = Deadline::new(t0, Duration::from_secs(1), "p".into());
        let mut c = Connector::new(hello(1, 1, 0), dl.clone());
        c.connected().unwrap();
        c.received(&hello(1, 1, 5).encode()).unwrap();
        c.brought_up().unwrap();
        assert!(c.is_done());
        c.tick(t0 + Duration::from_secs(100)).unwrap();
        let mut a = Acceptor::new(1, dl);
        a.received(&hello(1, 1, 0).encode()).unwrap();
        a.brought_up(&hello(0, 1, 9)).unwrap();
        a.received(&header(KIND_READY, 0, 1)).unwrap();
        assert!(a.is_done());
        a.tick(t0 + Duration::from_secs(100)).unwrap();
    }

    #[test]
    fn hello_roundtrip() {
        let h = hello(42, 3, 9);
        let b = h.encode();
        assert_eq!(b.len(), HELLO_LEN);
        assert_eq!(Hello::decode(&b, 42).unwrap(), h);
    }

    #[test]
    fn qp_attributes_follow_link_layer_and_settings() {
        let cfg = Config {
            traffic_class: 106,
            service_level: 3,
            timeout: 22,
            retry_cnt: 5,
            ..Config::default()
        };
        let remote = QpInfo {
            qpn: 77,
            lid: 12,
            link_layer: 2,
            mtu: 3,
            gid: [9; 16],
        };
        let roce = LocalPort {
            port: 1,
            link_layer: IBV_LINK_LAYER_ETHERNET,
            mtu: 5,
            gid_index: 3,
        };
        let (a, m) = rtr_attr(&roce, &remote, &cfg);
        assert_eq!((a.dest_qp_num, a.path_mtu, a.ah_attr.is_global), (77, 3, 1));
        assert_eq!(a.ah_attr.grh.dgid.raw, [9; 16]);
        assert_eq!(
            (a.ah_attr.grh.sgid_index, a.ah_attr.grh.traffic_class),
            (3, 106)
        );
        assert_eq!(a.ah_attr.sl, 3);
        assert!(m & verbs::IBV_QP_AV != 0 && m & verbs::IBV_QP_DEST_QPN != 0);
        let ib = LocalPort {
            link_layer: verbs::IBV_LINK_LAYER_INFINIBAND,
            ..roce
        };
        let (a, _) = rtr_attr(&ib, &remote, &cfg);
        assert_eq!((a.ah_attr.is_global, a.ah_attr.dlid), (0, 12));
        let (a, m) = rts_attr(&cfg);
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (22, 5, 7));
        assert!(m & verbs::IBV_QP_TIMEOUT != 0 && m & verbs::IBV_QP_RETRY_CNT != 0);
        let (a, _) = init_attr(&roce, &cfg);
        assert_eq!((a.qp_state, a.port_num), (verbs::IBV_QPS_INIT, 1));
    }
}
