//! The InfiniBand/RoCE network of oxccl (NCCL's IB transport in the
//! `ncclNet` role), exported through NCCL's C ABI as a plugin library:
//! `NCCL_NET_PLUGIN=/path/to/liboxccl_net_ib.so`.
//!
//! libibverbs is opened at run time (`verbs`), so the library loads on any
//! machine; with no library or no active port the network has 0 devices and
//! says why in one INFO line, and the core uses another network.
//!
//! Files mirror net-socket's roles: `device` (discovery, selection,
//! properties), `listen`, `connection` (connect/accept state machines and
//! the two ends), `request` (request and completion bookkeeping), `mr`
//! (memory registration cache), `handle` (what the peer is given); plus
//! `config` (settings) and `verbs` (the C library: all FFI; elsewhere only
//! `endpoint`'s isend/irecv/iflush call its two unsafe post functions).

#![deny(unsafe_code)]

mod config;
mod connection;
mod device;
mod endpoint;
mod handle;
mod listen;
mod mr;
mod request;
mod verbs;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use oxccl_plugin::ffi::{NCCL_LOG_INFO, NCCL_LOG_WARN};
use oxccl_plugin::net::export::log;
use oxccl_plugin::{ListenComm, Net, NetError, NetHandle, NetProperties, NetResult, SendComm};
use socket2::{Domain, Protocol, Socket, Type};

pub use crate::config::Config;
use crate::connection::{Connector, Deadline};
use crate::device::VDev;
use crate::endpoint::{IbSend, Resources};
use crate::handle::Handle;
use crate::listen::{IbListen, Wire};

/// The verbs network: one device per (possibly merged) active port.
pub struct IbNet {
    cfg: Config,
    devs: Vec<Arc<VDev>>,
    /// Connects in progress, found again through the key each one writes
    /// into its handle (QPs and a socket do not fit in 128 bytes).
    connecting: Mutex<HashMap<u64, Connecting>>,
}

/// The connecting side between calls.
struct Connecting {
    wire: Wire,
    connected: bool,
    machine: Connector,
    res: Resources,
    established: bool,
}

#[cfg(target_os = "linux")]
const EINPROGRESS: i32 = 115;
#[cfg(not(target_os = "linux"))]
const EINPROGRESS: i32 = 36;

impl Connecting {
    fn start(dev: Arc<VDev>, h: &Handle, cfg: &Config) -> NetResult<Connecting> {
        let res = Resources::create(dev, h.nqps as usize, cfg)?;
        let deadline = Deadline::new(
            std::time::Instant::now(),
            cfg.connect_timeout,
            h.addr.to_string(),
        );
        let machine = Connector::new(res.hello(h.magic), deadline);
        let sys = |e: std::io::Error| NetError::System(format!("IB connect to {}: {e}", h.addr));
        let s = Socket::new(
            Domain::for_address(h.addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(sys)?;
        s.set_nonblocking(true).map_err(sys)?;
        let _ = s.set_tcp_nodelay(true);
        match s.connect(&h.addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(EINPROGRESS) => {}
            Err(e) => return Err(sys(e)),
        }
        Ok(Connecting {
            wire: Wire::new(s, h.addr.to_string()),
            connected: false,
            machine,
            res,
            established: false,
        })
    }

    /// One round of progress; the send end once set-up is over.
    fn step(&mut self, cfg: &Config) -> NetResult<bool> {
        self.machine.tick(std::time::Instant::now())?;
        let mut actions = Vec::new();
        if !self.connected {
            if let Some(e) = self.wire.sock.take_error().ok().flatten() {
                return Err(NetError::System(format!(
                    "IB connect to {}: {e} (is the peer's listener up?)",
                    self.wire.peer
                )));
            }
            if self.wire.sock.peer_addr().is_err() {
                return Ok(false);
            }
            self.connected = true;
            actions = self.machine.connected()?;
        } else if !self.machine.is_done() {
            let bytes = self.wire.read(|| self.machine.closed())?;
            if !bytes.is_empty() {
                actions = self.machine.received(&bytes)?;
            }
        }
        let (res, machine) = (&self.res, &mut self.machine);
        self.established |= listen::apply(&mut self.wire, actions, |remote| {
            res.bring_up(&remote, cfg)?;
            machine.brought_up()
        })?;
        Ok(self.wire.flush()? && self.established)
    }
}

impl IbNet {
    /// Reads the NCCL_IB_* settings and finds the devices. Having none is
    /// not an error (0 devices, with the reason logged at INFO, or WARN
    /// when NCCL_IB_HCA selects nothing); a setting that cannot be parsed is.
    pub fn from_env() -> NetResult<IbNet> {
        let cfg = Config::from_env().map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        Ok(IbNet::with_config(cfg))
    }

    /// The network under explicit settings (tests, embedding).
    pub fn with_config(cfg: Config) -> IbNet {
        let devs = match device::discover(&cfg) {
            Ok((devs, warnings)) => {
                for w in warnings {
                    log(NCCL_LOG_WARN, &format!("NET/IB : {w}"));
                }
                let names: Vec<_> = devs.iter().map(VDev::describe).collect();
                log(
                    NCCL_LOG_INFO,
                    &format!(
                        "NET/IB : using {} device(s): {}",
                        devs.len(),
                        names.join(", ")
                    ),
                );
                devs.into_iter().map(Arc::new).collect()
            }
            Err(why) => {
                // A setting that selects nothing is the user's mistake: WARN.
                let level = match why {
                    device::NoDevice::HcaMatchesNothing { .. } => NCCL_LOG_WARN,
                    _ => NCCL_LOG_INFO,
                };
                log(level, &format!("NET/IB : {why}; 0 devices"));
                Vec::new()
            }
        };
        IbNet {
            cfg,
            devs,
            connecting: Mutex::new(HashMap::new()),
        }
    }

    fn dev(&self, dev: usize) -> NetResult<&Arc<VDev>> {
        self.devs.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "IB device {dev} does not exist ({} devices)",
                self.devs.len()
            ))
        })
    }
}

impl Net for IbNet {
    fn name(&self) -> &str {
        "IB"
    }

    fn devices(&self) -> NetResult<usize> {
        Ok(self.devs.len())
    }

    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        Ok(self.dev(dev)?.properties())
    }

    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let d = Arc::clone(self.dev(dev)?);
        let magic = random_u64();
        let (l, addr): (IbListen, SocketAddr) = IbListen::bind(d, self.cfg.clone(), magic)?;
        let h = Handle {
            addr,
            nqps: self.cfg.qps_per_conn as u8,
            magic,
        };
        Ok((h.encode(), Box::new(l)))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        let d = self.dev(dev)?;
        let h = Handle::decode(handle)?;
        let mut map = self
            .connecting
            .lock()
            .map_err(|_| NetError::Internal("IB connect state poisoned by a panic".into()))?;
        let key = match handle::connect_key(handle) {
            Some(k) if map.contains_key(&k) => k,
            // A fresh handle, or one whose connect ended: start over.
            _ => {
                let k = random_u64();
                map.insert(k, Connecting::start(Arc::clone(d), &h, &self.cfg)?);
                handle::set_connect_key(handle, Some(k));
                k
            }
        };
        let step = map.get_mut(&key).expect("inserted above").step(&self.cfg);
        match step {
            Ok(false) => Ok(None),
            Ok(true) => {
                let c = map.remove(&key).expect("present");
                handle::set_connect_key(handle, None);
                Ok(Some(Box::new(IbSend::new(c.res, c.wire.peer))))
            }
            Err(e) => {
                map.remove(&key);
                handle::set_connect_key(handle, None);
                Err(e)
            }
        }
    }
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn init() -> NetResult<Box<dyn Net>> {
    Ok(Box::new(IbNet::from_env()?))
}

// NCCL_NET_PLUGIN=/path/to/liboxccl_net_ib.so
oxccl_plugin::export_net_plugin!("oxccl-IB", init);

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever this machine has, a disabled network has no device and
    /// refuses device-bound calls with an error instead of panicking.
    #[test]
    fn no_device_means_errors_not_panics() {
        let net = IbNet::with_config(Config {
            disable: true,
            ..Config::default()
        });
        assert_eq!(net.devices().unwrap(), 0);
        assert!(net.properties(0).is_err());
        assert!(net.listen(0).is_err());
        let mut h = [0u8; oxccl_plugin::NET_HANDLE_MAXSIZE];
        let e = net.connect(0, &mut h).err().expect("no device 0");
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    /// On a machine without RDMA devices (CI, this one) discovery says why.
    #[test]
    fn discovery_without_hardware_has_a_reason() {
        if std::path::Path::new("/sys/class/infiniband").exists() {
            println!("skipped: this machine has RDMA devices");
            return;
        }
        let e = device::discover(&Config::default())
            .err()
            .expect("no device here");
        let t = e.to_string();
        assert!(
            t.contains("libibverbs.so.1 not found") || t.contains("no IB device"),
            "{t}"
        );
    }
}
