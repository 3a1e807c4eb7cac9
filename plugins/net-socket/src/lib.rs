//! The TCP network of oxccl (NCCL's socket transport in the `ncclNet`
//! role): the built-in default, registered with `inventory`.
//!
//! Files mirror the roles every network plugin has: `device` (discovery,
//! properties), `listen`, `connection` (both ends), `request` (queues and
//! completion), `threads` (helpers), `handle` (what the peer is given).

mod connection;
mod device;
mod handle;
mod listen;
mod request;
mod threads;

use std::net::{SocketAddr, TcpListener};

use oxccl_netif::{Family, Iface};
use oxccl_plugin::{
    BuiltinNet, ListenComm, Net, NetError, NetHandle, NetProperties, NetResult, SendComm,
};

pub use handle::Handle;

/// The socket network: one device per chosen interface.
pub struct SocketNet {
    devs: Vec<Iface>,
    nthreads: usize,
    socks_per_thread: usize,
}

fn env_num(name: &str, default: usize) -> Result<usize, NetError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| NetError::InvalidArgument(format!("{name}={v:?} is not a number"))),
        _ => Ok(default),
    }
}

impl SocketNet {
    /// Settings from the environment, as NCCL's socket transport reads them:
    /// NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_SOCKET_NTHREADS,
    /// NCCL_NSOCKS_PERTHREAD.
    pub fn from_env() -> NetResult<SocketNet> {
        let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
        let fam = std::env::var("NCCL_SOCKET_FAMILY").ok();
        let family =
            Family::parse(fam.as_deref()).map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        SocketNet::new(
            ifname.as_deref(),
            family,
            env_num("NCCL_SOCKET_NTHREADS", 2)?,
            env_num("NCCL_NSOCKS_PERTHREAD", 2)?,
        )
    }

    pub fn new(
        ifname: Option<&str>,
        family: Family,
        nthreads: usize,
        socks_per_thread: usize,
    ) -> NetResult<SocketNet> {
        // 0 threads: no data sockets, the caller's thread moves everything.
        let nthreads = nthreads.min(16);
        let socks_per_thread = socks_per_thread.clamp(1, 64 / nthreads.max(1));
        Ok(SocketNet {
            devs: device::discover(ifname, family)?,
            nthreads,
            socks_per_thread,
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
        let listener = TcpListener::bind(SocketAddr::new(iface.addr, 0)).map_err(|e| {
            NetError::System(format!("listen on {} ({}): {e}", iface.name, iface.addr))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| NetError::System(e.to_string()))?;
        let nsocks = self.nthreads * self.socks_per_thread;
        let conn_id = random_u64();
        let handle = Handle {
            addr,
            nsocks: nsocks as u8,
            conn_id,
        };
        let l = listen::SocketListen::new(listener, nsocks, self.socks_per_thread, conn_id)
            .map_err(|e| NetError::System(e.to_string()))?;
        Ok((handle.encode(), Box::new(l)))
    }

    fn connect(&self, _dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        let h = Handle::decode(handle)?;
        let socks = connection::open(&h)?;
        let per = (h.nsocks as usize / self.nthreads.max(1)).max(1);
        let queue = connection::assemble(true, h.addr.to_string(), socks, per)?;
        Ok(Some(Box::new(connection::SocketSend { queue })))
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
    BuiltinNet { name: "Socket", priority: 100, init }
}

// The same network as a plugin library that NCCL (and oxccl) load by path:
// NCCL_NET_PLUGIN=/path/to/liboxccl_net_socket.so
oxccl_plugin::export_net_plugin!("oxccl-Socket", init);

/// Referenced by the core so that the linker keeps this crate, and with it
/// the registration above.
pub fn force_link() {}

#[cfg(test)]
mod tests;
