//! The TCP network of oxccl (NCCL's socket transport in the `ncclNet`
//! role): the built-in default, registered with `inventory`, and the same
//! network exported through NCCL's C ABI for a plugin library.
//!
//! A connection is one control socket and `nthreads * socks_per_thread`
//! data sockets. Message headers and small messages travel on the control
//! socket, moved by whoever calls `test` (lowest latency); large messages
//! are striped over the data sockets by helper threads (more streams and
//! cores than one socket gives). Nothing the core calls ever blocks.
//!
//! Files mirror the roles every network plugin has (net-ib keeps the same
//! names): `device` (discovery, properties), `listen`, `connection`
//! (connect/accept state machines and the two ends), `request` (matching
//! and completion), `threads` (helpers), `handle` (what the peer is given).

mod connection;
mod device;
mod handle;
mod listen;
mod request;
mod stream;
mod threads;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_netif::{Family, Iface};
use oxccl_plugin::{
    BuiltinNet, ListenComm, Net, NetError, NetHandle, NetProperties, NetResult, SendComm,
};
use oxccl_secure::Key;

use crate::connection::Connecting;
pub use crate::handle::Handle;

pub use crate::device::MAX_DEVICES;
pub use crate::handle::{MAX_SOCKETS, MAX_THREADS};

/// The socket network: one device per chosen interface.
pub struct SocketNet {
    devs: Vec<Iface>,
    nthreads: usize,
    socks_per_thread: usize,
    /// Connects in progress, found again through the key each one writes
    /// into its handle (the handle alone has too little room for sockets).
    connecting: Mutex<HashMap<u64, Connecting>>,
    /// How long a refused connect is retried before it is an error, where
    /// NCCL_SOCKET_RETRY_CNT and _SLEEP_MSEC are unset (`retry`).
    connect_retry: Duration,
    /// NCCL's retries (NCCL_SOCKET_RETRY_CNT, NCCL_SOCKET_RETRY_SLEEP_MSEC)
    /// where either is set: they replace `connect_retry`.
    retry: Option<oxccl_netif::Retry>,
    /// How long one socket may take over its handshake and introduction
    /// ([`connection::HANDSHAKE_WAIT`]; shorter in tests).
    handshake_wait: Duration,
    /// With a key (NCCL_SOCKET_KEY_FILE) every socket is authenticated and
    /// encrypted by `oxccl_secure`.
    key: Option<Arc<Key>>,
}

/// A whole number from the environment within `range` (NCCL's limits);
/// `default` where unset or blank, an error naming the variable where it
/// is not a number or out of range (where NCCL cuts it to the limit).
fn env_num(
    name: &str,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, NetError> {
    num_in(name, std::env::var(name).ok(), default, range)
}

/// [`env_num`] on a given value (`None`: unset).
fn num_in(
    name: &str,
    value: Option<String>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, NetError> {
    match value {
        Some(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                NetError::InvalidArgument(format!(
                    "{name}={v:?}: expected a whole number from {} to {}",
                    range.start(),
                    range.end()
                ))
            }),
        _ => Ok(default),
    }
}

/// Helper threads and data sockets per thread of a connection, where the
/// environment does not say. Below 8 cores none: the caller's thread moves
/// the data (the cores are busy with the kernel's TCP work anyway). From 8
/// cores on 2 x 2; with a key 4 x 2, since a helper thread seals (or opens)
/// each record before it sends (or after it reads) it, so that one thread
/// moves half the bytes it moves in clear, and a message's stripes wait on
/// the thread's earlier ones: on the 16-core GPU machine, 4 x 2 encrypted
/// reached 0.86 of the clear default at 64 MiB all_reduce where 2 x 2 reached
/// 0.73 (2026-11-25, 5fe7d50).
fn default_threads(cores: usize, keyed: bool) -> (usize, usize) {
    match (cores >= 8, keyed) {
        (false, _) => (0, 1),
        (true, false) => (2, 2),
        (true, true) => (4, 2),
    }
}

impl SocketNet {
    /// Settings from the environment, as NCCL's socket transport reads them
    /// (a plugin reads its own settings; it never links the core):
    /// NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_SOCKET_NTHREADS and
    /// NCCL_NSOCKS_PERTHREAD (default 2 x 2 on 8 or more cores, 4 x 2 there
    /// with a key; below 8 cores 0 threads: the caller's thread moves the
    /// data, fastest on 2 cores: docs/performance.md, "Tried and not
    /// kept"), and NCCL_SOCKET_KEY_FILE (encryption).
    pub fn from_env() -> NetResult<SocketNet> {
        let key = Key::from_env().map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
        let fam = std::env::var("NCCL_SOCKET_FAMILY").ok();
        let family =
            Family::parse(fam.as_deref()).map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (threads, socks) = default_threads(cores, key.is_some());
        let threads = env_num("NCCL_SOCKET_NTHREADS", threads, 0..=MAX_THREADS)?;
        let socks = env_num("NCCL_NSOCKS_PERTHREAD", socks, 1..=MAX_SOCKETS)?;
        if threads * socks > MAX_SOCKETS {
            return Err(NetError::InvalidArgument(format!(
                "NCCL_SOCKET_NTHREADS={threads} x NCCL_NSOCKS_PERTHREAD={socks}: at most {MAX_SOCKETS} sockets per connection"
            )));
        }
        let retry = oxccl_netif::Retry::from_env().map_err(NetError::InvalidArgument)?;
        SocketNet::new(ifname.as_deref(), family, threads, socks).map(|mut n| {
            n.retry = retry;
            n.with_key(key.map(Arc::new))
        })
    }

    /// Authenticates and encrypts every connection with `key` (`None`: in
    /// clear). Both ends must use the same.
    pub fn with_key(mut self, key: Option<Arc<Key>>) -> SocketNet {
        self.key = key;
        self
    }

    /// A network on the interfaces `ifname` selects (NCCL_SOCKET_IFNAME
    /// syntax; `None` for NCCL's default order), with `nthreads` helper
    /// threads per connection each owning `socks_per_thread` data sockets.
    /// `nthreads` 0 sends everything over the control socket, moved by the
    /// thread that calls `test`. Limits as NCCL's: at most 16 threads and
    /// 64 data sockets.
    pub fn new(
        ifname: Option<&str>,
        family: Family,
        nthreads: usize,
        socks_per_thread: usize,
    ) -> NetResult<SocketNet> {
        let nthreads = nthreads.min(MAX_THREADS);
        let socks_per_thread = socks_per_thread.clamp(1, MAX_SOCKETS / nthreads.max(1));
        Ok(SocketNet {
            devs: device::discover(ifname, family)?,
            nthreads,
            socks_per_thread,
            connecting: Mutex::new(HashMap::new()),
            connect_retry: connection::CONNECT_RETRY_FOR,
            retry: None,
            handshake_wait: connection::HANDSHAKE_WAIT,
            key: None,
        })
    }

    fn dev(&self, dev: usize) -> NetResult<&Iface> {
        self.devs.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "device {dev} does not exist ({} devices)",
                self.devs.len()
            ))
        })
    }
}

impl Net for SocketNet {
    fn name(&self) -> &str {
        "Socket"
    }

    fn devices(&self) -> NetResult<usize> {
        Ok(self.devs.len())
    }

    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        Ok(device::properties(self.dev(dev)?))
    }

    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let iface = self.dev(dev)?;
        let conn_id = random_u64();
        let nsocks = self.nthreads * self.socks_per_thread;
        let (l, addr) = listen::SocketListen::bind(
            device::bind_addr(iface),
            self.nthreads,
            nsocks,
            conn_id,
            self.handshake_wait,
            self.key.clone(),
        )
        .map_err(|e| NetError::System(format!("listen on {} ({}): {e}", iface.name, iface.addr)))?;
        let handle = Handle {
            addr,
            nthreads: self.nthreads as u8,
            socks_per_thread: self.socks_per_thread as u8,
            conn_id,
        };
        Ok((handle.encode(), Box::new(l)))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        self.dev(dev)?;
        let h = Handle::decode(handle)?;
        let mut map = self
            .connecting
            .lock()
            .map_err(|_| NetError::Internal("socket connect state poisoned by a panic".into()))?;
        let key = match handle::connect_key(handle) {
            Some(k) if map.contains_key(&k) => k,
            // A fresh handle, or one whose connect already ended: start over.
            _ => {
                let k = random_u64();
                map.insert(
                    k,
                    Connecting::new(
                        h,
                        (self.connect_retry, self.retry),
                        self.handshake_wait,
                        self.key.clone(),
                    ),
                );
                handle::set_connect_key(handle, Some(k));
                k
            }
        };
        let step = map.get_mut(&key).expect("inserted above").step();
        let socks = match step {
            Ok(None) => return Ok(None),
            Ok(Some(socks)) => socks,
            Err(e) => {
                map.remove(&key);
                handle::set_connect_key(handle, None);
                return Err(e);
            }
        };
        map.remove(&key);
        drop(map);
        handle::set_connect_key(handle, None);
        let queue = connection::assemble(true, h.addr.to_string(), socks, h.nthreads as usize)?;
        Ok(Some(Box::new(connection::SocketSend::new(queue))))
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
    Ok(Box::new(SocketNet::from_env()?))
}

oxccl_plugin::inventory::submit! {
    BuiltinNet { name: "Socket", priority: 100, init, abi: Some(__oxccl_net_symbol) }
}

// The same network as a plugin library that NCCL (and oxccl) load by path:
// NCCL_NET_PLUGIN=/path/to/liboxccl_net_socket.so
oxccl_plugin::export_net_plugin!("oxccl-Socket", init);

/// Referenced by the core so that the linker keeps this crate, and with it
/// the registration above.
pub fn force_link() {}

#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;

#[cfg(test)]
mod tests;
