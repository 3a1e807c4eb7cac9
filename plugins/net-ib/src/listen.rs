//! Listening, and the socket I/O that drives the set-up state machines of
//! `connection` on both sides. The QP exchange runs over TCP on the
//! bootstrap interface (NCCL_SOCKET_IFNAME, as NCCL's IB transport); every
//! call does what the socket allows now and returns.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use oxccl_plugin::{ListenComm, NetError, NetResult, RecvComm};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::Config;
use crate::connection::{Acceptor, Action, Deadline, Hello};
use crate::device::VDev;
use crate::endpoint::{IbRecv, Resources};

/// The address the QP exchange listens on: the first interface NCCL's
/// socket rules choose.
pub fn oob_ip() -> NetResult<IpAddr> {
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
    let fam = std::env::var("NCCL_SOCKET_FAMILY").ok();
    let family = oxccl_netif::Family::parse(fam.as_deref())
        .map_err(|e| NetError::InvalidArgument(e.to_string()))?;
    let ifs = oxccl_netif::find_interfaces(ifname.as_deref(), family, 1)
        .map_err(|e| NetError::InvalidArgument(e.to_string()))?;
    ifs.first().map(|i| i.addr).ok_or_else(|| {
        NetError::System(
            "no network interface for the IB connection set-up (check NCCL_SOCKET_IFNAME)".into(),
        )
    })
}

/// A non-blocking socket with the bytes still to write.
pub struct Wire {
    pub sock: Socket,
    out: Vec<u8>,
    pub peer: String,
}

impl Wire {
    pub fn new(sock: Socket, peer: String) -> Wire {
        Wire {
            sock,
            out: Vec::new(),
            peer,
        }
    }

    fn err(&self, e: std::io::Error) -> NetError {
        NetError::Remote(format!("IB connection set-up with {}: {e}", self.peer))
    }

    pub fn queue(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }

    /// Writes what it can; true once nothing is left.
    pub fn flush(&mut self) -> NetResult<bool> {
        while !self.out.is_empty() {
            match self.sock.write(&self.out) {
                Ok(0) => return Err(self.err(ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(true)
    }

    /// Bytes available now (maybe none); `Err` when the peer closed.
    pub fn read(&mut self, closed: impl FnOnce() -> NetError) -> NetResult<Vec<u8>> {
        let mut buf = [0u8; 1024];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => return Err(closed()),
                Ok(n) => return Ok(buf[..n].to_vec()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Vec::new()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err(e)),
            }
        }
    }
}

struct Accepting {
    wire: Wire,
    machine: Acceptor,
    res: Option<Resources>,
    established: bool,
}

pub struct IbListen {
    listener: Socket,
    dev: Arc<VDev>,
    cfg: Config,
    magic: u64,
    pending: Option<Accepting>,
}

impl IbListen {
    pub fn bind(dev: Arc<VDev>, cfg: Config, magic: u64) -> NetResult<(IbListen, SocketAddr)> {
        let ip = oob_ip()?;
        let sys = |e: std::io::Error| NetError::System(format!("IB listen on {ip}: {e}"));
        let addr = SocketAddr::new(ip, 0);
        let l = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(sys)?;
        l.bind(&addr.into()).map_err(sys)?;
        l.listen(128).map_err(sys)?;
        l.set_nonblocking(true).map_err(sys)?;
        let local = l
            .local_addr()
            .map_err(sys)?
            .as_socket()
            .ok_or_else(|| NetError::System("IB listener has no IP address".into()))?;
        Ok((
            IbListen {
                listener: l,
                dev,
                cfg,
                magic,
                pending: None,
            },
            local,
        ))
    }

    fn step(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        let Some(a) = self.pending.as_mut() else {
            return Ok(None);
        };
        a.machine.tick(std::time::Instant::now())?;
        let mut actions = Vec::new();
        if !a.machine.is_done() {
            let bytes = a.wire.read(|| a.machine.closed())?;
            if !bytes.is_empty() {
                actions = a.machine.received(&bytes)?;
            }
        }
        let (dev, cfg, magic) = (&self.dev, &self.cfg, self.magic);
        let (machine, res) = (&mut a.machine, &mut a.res);
        a.established |= apply(&mut a.wire, actions, |remote| {
            let mut r = Resources::create(Arc::clone(dev), remote.qps.len(), cfg)?;
            r.bring_up(&remote, cfg)?;
            if flush_enabled(dev.ptr_support, cfg) {
                r.add_flush(cfg)?;
            }
            let next = machine.brought_up(&r.hello(magic))?;
            *res = Some(r);
            Ok(next)
        })?;
        if a.wire.flush()? && a.established {
            let a = self.pending.take().expect("checked above");
            let res = a.res.ok_or_else(|| {
                NetError::Internal("IB accept established without resources".into())
            })?;
            return Ok(Some(Box::new(IbRecv::new(res, a.wire.peer))));
        }
        Ok(None)
    }
}

/// NCCL's rule: receives are flushed when GPU memory can reach the NIC
/// (peer memory or dma-buf) unless NCCL_GDR_FLUSH_DISABLE=1.
pub fn flush_enabled(ptr_support: i32, cfg: &Config) -> bool {
    use oxccl_plugin::PtrType;
    ptr_support & (PtrType::Cuda as i32 | PtrType::Dmabuf as i32) != 0 && !cfg.gdr_flush_disable
}

/// Carries out a set-up machine's actions: bytes are queued on `wire`,
/// QPs are brought up by `bring_up` (which returns the machine's next
/// actions). True when the machine declared the set-up over.
pub fn apply(
    wire: &mut Wire,
    mut actions: Vec<Action>,
    mut bring_up: impl FnMut(Hello) -> NetResult<Vec<Action>>,
) -> NetResult<bool> {
    let mut established = false;
    while !actions.is_empty() {
        let mut next = Vec::new();
        for act in actions {
            match act {
                Action::Write(b) => wire.queue(&b),
                Action::BringUp(remote) => next.extend(bring_up(remote)?),
                Action::Established => established = true,
            }
        }
        actions = next;
    }
    Ok(established)
}

impl ListenComm for IbListen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        if self.pending.is_none() {
            match self.listener.accept() {
                Ok((s, peer)) => {
                    s.set_nonblocking(true)
                        .map_err(|e| NetError::System(format!("IB accept: {e}")))?;
                    let _ = s.set_tcp_nodelay(true);
                    let peer = peer
                        .as_socket()
                        .map_or_else(|| "?".to_string(), |a| a.to_string());
                    let deadline = Deadline::new(
                        std::time::Instant::now(),
                        self.cfg.connect_timeout,
                        peer.clone(),
                    );
                    self.pending = Some(Accepting {
                        wire: Wire::new(s, peer),
                        machine: Acceptor::new(self.magic, deadline),
                        res: None,
                        established: false,
                    });
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    return Ok(None)
                }
                Err(e) => return Err(NetError::System(format!("IB accept: {e}"))),
            }
        }
        let r = self.step();
        if r.is_err() {
            // A broken peer must not wedge the listener for the next one.
            self.pending = None;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Connector, QpInfo};

    fn far() -> Deadline {
        Deadline::new(
            std::time::Instant::now(),
            std::time::Duration::from_secs(3600),
            "peer".into(),
        )
    }

    fn hello(magic: u64, base: u32) -> Hello {
        Hello {
            magic,
            qps: (0..2)
                .map(|i| QpInfo {
                    qpn: base + i,
                    ..QpInfo::default()
                })
                .collect(),
        }
    }

    /// A connected pair of non-blocking TCP sockets on loopback.
    fn pair() -> (Wire, Wire) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        a.set_nonblocking(true).unwrap();
        (
            Wire::new(Socket::from(c), "acceptor".into()),
            Wire::new(Socket::from(a), "connector".into()),
        )
    }

    /// The set-up machines over real non-blocking sockets, through the
    /// same `Wire` and `apply` the network uses, with the QP bring-up
    /// replaced by recording what each side was told.
    #[test]
    fn setup_over_loopback_tcp() {
        let (mut cw, mut aw) = pair();
        let mut c = Connector::new(hello(7, 100), far());
        let mut a = Acceptor::new(7, far());
        let (mut c_est, mut a_est) = (false, false);
        let (mut c_saw, mut a_saw) = (None, None);
        let first = c.connected().unwrap();
        c_est |= apply(&mut cw, first, |_| unreachable!()).unwrap();
        for _ in 0..10_000 {
            cw.flush().unwrap();
            aw.flush().unwrap();
            if !a.is_done() {
                let b = aw.read(|| a.closed()).unwrap();
                if !b.is_empty() {
                    let acts = a.received(&b).unwrap();
                    a_est |= apply(&mut aw, acts, |r| {
                        a_saw = Some(r);
                        a.brought_up(&hello(0, 200))
                    })
                    .unwrap();
                }
            }
            if !c.is_done() {
                let b = cw.read(|| c.closed()).unwrap();
                if !b.is_empty() {
                    let acts = c.received(&b).unwrap();
                    c_est |= apply(&mut cw, acts, |r| {
                        c_saw = Some(r);
                        c.brought_up()
                    })
                    .unwrap();
                }
            }
            if c_est && a_est && cw.flush().unwrap() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(c_est && a_est, "set-up did not finish");
        assert_eq!(c_saw.unwrap(), hello(7, 200));
        assert_eq!(a_saw.unwrap(), hello(7, 100));
    }

    #[test]
    fn peer_closing_mid_setup_is_a_remote_error() {
        let (mut cw, aw) = pair();
        let mut c = Connector::new(hello(7, 100), far());
        let first = c.connected().unwrap();
        apply(&mut cw, first, |_| unreachable!()).unwrap();
        drop(aw);
        let mut err = None;
        for _ in 0..1000 {
            let _ = cw.flush();
            match cw.read(|| c.closed()) {
                Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let e = err.expect("the close is seen");
        assert!(matches!(e, NetError::Remote(_)), "{e}");
    }
}
