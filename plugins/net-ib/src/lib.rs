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
//! `config` (settings) and `verbs` (the C library, the only unsafe code).

mod config;
mod connection;
mod device;
mod handle;
mod mr;
mod request;
mod verbs;

use oxccl_plugin::ffi::{export::log, NCCL_LOG_INFO, NCCL_LOG_WARN};
use oxccl_plugin::{ListenComm, Net, NetError, NetHandle, NetProperties, NetResult, SendComm};

pub use crate::config::Config;
use crate::device::VDev;

/// The verbs network: one device per (possibly merged) active port.
pub struct IbNet {
    cfg: Config,
    devs: Vec<VDev>,
}

impl IbNet {
    /// Reads the NCCL_IB_* settings and finds the devices. Having none is
    /// not an error (0 devices, with the reason logged at INFO); a setting
    /// that cannot be parsed is.
    pub fn from_env() -> NetResult<IbNet> {
        let cfg = Config::from_env().map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        let devs = match device::discover(&cfg) {
            Ok((devs, warnings)) => {
                for w in warnings {
                    log(NCCL_LOG_WARN, &format!("NET/IB : {w}"));
                }
                let names: Vec<_> = devs.iter().map(VDev::name).collect();
                log(
                    NCCL_LOG_INFO,
                    &format!(
                        "NET/IB : using {} device(s): {}",
                        devs.len(),
                        names.join(", ")
                    ),
                );
                devs
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
        Ok(IbNet { cfg, devs })
    }

    fn dev(&self, dev: usize) -> NetResult<&VDev> {
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
        self.dev(dev)?;
        let _ = &self.cfg;
        Err(NetError::Internal("IB listen: not implemented yet".into()))
    }

    fn connect(&self, dev: usize, _handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        self.dev(dev)?;
        Err(NetError::Internal("IB connect: not implemented yet".into()))
    }
}

fn init() -> NetResult<Box<dyn Net>> {
    Ok(Box::new(IbNet::from_env()?))
}

// NCCL_NET_PLUGIN=/path/to/liboxccl_net_ib.so
oxccl_plugin::export_net_plugin!("oxccl-IB", init);
