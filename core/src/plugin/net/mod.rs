//! The network plugin: found as NCCL 2.30 finds it (see `oxccl_plugin::loader`),
//! the newest `ncclNetPlugin_vN` it exports taken (v12 down to v8), and
//! reached through the SDK's C loader ([`oxccl_plugin::net::load`]) —
//! built-ins as well, so that every run exercises the ABI. A CollNet vtable
//! exported beside it is `collnet`'s.

pub mod collnet;
#[cfg(test)]
mod load_tests;

use std::sync::Arc;

use oxccl_plugin::{BuiltinNet, Net, NetError, NetResult};
use tracing::{info, warn};

use crate::error::Result;
use oxccl_plugin::loader::{self, Lib};
use oxccl_plugin::net::load::{self as ffi, Host};

pub use ffi::{Refusal, SYMBOLS};

/// What the core gives every net plugin's `init`: its logger, and the
/// profiler callback through which events the plugin reports under an
/// operation's handle reach the profiler (as NCCL gives it).
pub(crate) fn host() -> Host {
    Host {
        log: crate::plugin::ffi_log::logger(),
        prof: Some(crate::plugin::profiler::net_callback as _),
    }
}

/// The library names tried for a setting, in order; none for `none`.
pub fn candidates(setting: Option<&str>) -> Vec<String> {
    loader::candidates(loader::NET, setting)
}

pub use oxccl_plugin::loader::Outcome;

/// A network as the process chose it, before any communicator's context:
/// each communicator takes its own view ([`Network::for_comm`]). There is
/// no process-wide context (NCCL has none either): whoever needs the network
/// without a communicator takes a short-lived one ([`Network::probe`]).
#[derive(Clone)]
pub struct Network(Kind);

#[derive(Clone)]
enum Kind {
    /// Reached through a C vtable: v11+ vtables take a context per
    /// communicator.
    C(Arc<ffi::CPlugin>),
    /// A built-in that exports no vtable: one instance serves everyone.
    Native(Arc<dyn Net>),
}

impl Network {
    fn c(plugin: ffi::CPlugin) -> Network {
        Network(Kind::C(Arc::new(plugin)))
    }

    pub fn name(&self) -> &str {
        match &self.0 {
            Kind::C(p) => p.name(),
            Kind::Native(n) => n.name(),
        }
    }

    /// The network for the communicator whose NCCL commHash is `comm_hash`:
    /// a v11/v12 vtable gets `init(&ctx, comm_hash, …)` here, and that
    /// context is used by the returned value's listen/connect and finalized
    /// when it and every connection made through it are dropped. The
    /// library and vtable stay shared. Older versions and native networks
    /// have no context: every communicator shares the process's `init`.
    /// `traffic_class`: the communicator's config's (NCCL's
    /// `trafficClass`), which the v11+ context carries to the plugin.
    pub fn for_comm(&self, comm_hash: u64, traffic_class: Option<i32>) -> NetResult<Arc<dyn Net>> {
        match &self.0 {
            Kind::C(p) => Ok(Arc::new(p.open(comm_hash, traffic_class)?)),
            Kind::Native(n) => Ok(n.clone()),
        }
    }

    /// The network for a look at its devices when no communicator exists
    /// (`oxccl info`): v11+ makes a context for it (commId 0), finalized as
    /// soon as the returned value is dropped, so drop it right after use.
    pub fn probe(&self) -> NetResult<Arc<dyn Net>> {
        self.for_comm(0, None)
    }

    /// The WARN line for a network whose `init` failed `e`, in the form of
    /// a library's refusal when it is one.
    pub fn init_failed_line(&self, library: &str, e: &NetError) -> String {
        match &self.0 {
            Kind::C(p) => refusal_line(library, &p.refusal(p.init_failed(e))),
            Kind::Native(n) => format!("net {}: init failed: {e}", n.name()),
        }
    }
}

/// Loads the network plugin the setting asks for. A library named
/// explicitly that is nowhere to be found, one that cannot be opened,
/// exports no version we load, has a NULL required entry or (before v11)
/// fails `init` gives one WARN line naming what was tried and `None`: the
/// caller falls back to the built-in network, as NCCL 2.30 goes on with
/// its internal ones (a job that runs on NCCL under a cluster-wide
/// NCCL_NET_PLUGIN runs here too; the ranks then check that they all took
/// the same network). From v11 on `init` runs with the first
/// communicator's context (see [`Network::for_comm`]); the caller refuses
/// the library then if it fails.
pub fn load(setting: Option<&str>) -> Result<(Option<Network>, Outcome)> {
    let search = loader::open(loader::NET, setting);
    let searched = search.tried.clone();
    if let (Some(l), Ok(mut slot)) = (&search.opened, OPENED.lock()) {
        *slot = Some(l.clone());
    }
    let Some(lib) = search.opened else {
        if let Some((library, why)) = search.failed.first() {
            let reason = format!("cannot be opened: {why}");
            let looked: Vec<&str> = SYMBOLS.iter().map(|s| s.0).collect();
            warn!(target: "oxccl::init|net", "{}; using the built-in network",
                loader::refusal("net", library, &looked, &[], &reason));
            return Ok((
                None,
                Outcome::Refused {
                    library: library.clone(),
                    reason,
                    searched,
                },
            ));
        }
        if loader::explicit(setting) {
            let setting = setting.unwrap_or_default().trim().to_string();
            let reason = format!("no such library (tried {})", searched.join(", "));
            warn!(target: "oxccl::init|net", "NCCL_NET_PLUGIN={setting}: {reason}; using the built-in network");
            return Ok((
                None,
                Outcome::Refused {
                    library: setting,
                    reason,
                    searched,
                },
            ));
        }
        if !searched.is_empty() {
            info!(target: "oxccl::init|net", "NET/Plugin: could not find {}; using the built-in network", searched.join(", "));
        }
        return Ok((None, Outcome::NotFound { searched }));
    };
    collnet::note(&lib);
    match ffi::CPlugin::negotiate(&lib, host()) {
        Ok(net) => {
            let version = net.version();
            info!(target: "oxccl::init|net",
                "loaded net plugin {} from {} (ncclNetPlugin_{version})", net.name(), lib.name());
            Ok((
                Some(Network::c(net)),
                Outcome::Loaded {
                    library: lib.name().to_string(),
                    version,
                    searched,
                },
            ))
        }
        Err(r) => {
            warn!(target: "oxccl::init|net", "{}; using the built-in network", refusal_line(lib.name(), &r));
            Ok((
                None,
                Outcome::Refused {
                    library: lib.name().to_string(),
                    reason: r.reason,
                    searched,
                },
            ))
        }
    }
}

/// The net plugin library last opened, where the tuner loader also looks.
static OPENED: std::sync::Mutex<Option<Lib>> = std::sync::Mutex::new(None);

/// The net plugin library opened by [`load`], if any.
pub fn opened_library() -> Option<Lib> {
    OPENED.lock().ok().and_then(|s| s.clone())
}

/// The one WARN line for a refused library.
pub fn refusal_line(library: &str, r: &Refusal) -> String {
    loader::refusal("net", library, &r.looked, &r.found, &r.reason)
}

/// Starts a built-in network: through its exported C vtable when it has one
/// (the same negotiation and adapter as a library), else natively.
pub fn builtin(b: &BuiltinNet) -> NetResult<Network> {
    let Some(symbols) = b.abi else {
        return Ok(Network(Kind::Native(Arc::from((b.init)()?))));
    };
    let lib = Lib::Builtin {
        name: b.name,
        symbols,
    };
    match ffi::CPlugin::negotiate(&lib, host()) {
        Ok(net) => {
            tracing::debug!(target: "oxccl::net",
                "built-in network {} through ncclNetPlugin_{}", b.name, net.version());
            Ok(Network::c(net.renamed(b.name)))
        }
        Err(r) => Err(NetError::Internal(refusal_line(b.name, &r))),
    }
}

/// `network`'s devices ("2 device(s): eth0 (10000 Mb/s), …"), looked at
/// through a context of its own (v11+) that is finalized before this returns.
pub fn devices_line(network: &Network) -> NetResult<String> {
    let net = network.probe()?;
    let n = net.devices()?;
    let devs: Vec<String> = (0..n)
        .filter_map(|d| net.properties(d).ok())
        .map(|p| format!("{} ({} Mb/s)", p.name, p.speed_mbps))
        .collect();
    Ok(format!("{n} device(s): {}", devs.join(", ")))
}

/// Each built-in network with the ABI it is reached through ("ncclNetPlugin_v12",
/// or "native" for one that exports no vtable), for `oxccl info`.
pub fn builtin_abis() -> Vec<(&'static str, String)> {
    oxccl_net_socket::force_link();
    oxccl_plugin::builtin_nets()
        .into_iter()
        .map(|b| {
            let abi = match b.abi {
                None => "native (no C vtable exported)".to_string(),
                Some(symbols) => match ffi::CPlugin::negotiate(
                    &Lib::Builtin {
                        name: b.name,
                        symbols,
                    },
                    host(),
                ) {
                    Ok(n) => format!("ncclNetPlugin_{}", n.version()),
                    Err(r) => format!("unusable: {}", r.reason),
                },
            };
            (b.name, abi)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL 2.30 logs that it could not load a missing NCCL_NET_PLUGIN
    /// and goes on with its internal networks; so does this (it stopped
    /// every rank: issue 40, item 12).
    #[test]
    fn explicit_missing_library_is_refused_with_a_warning() {
        for setting in ["/nonexistent/libx.so", "no-such-net"] {
            let ((net, outcome), lines) =
                crate::log::capture_lines(|| load(Some(setting)).unwrap());
            assert!(net.is_none());
            match outcome {
                Outcome::Refused {
                    library, reason, ..
                } => {
                    assert_eq!(library, setting);
                    assert!(
                        reason.contains("tried") && reason.contains(setting),
                        "{reason}"
                    );
                }
                o => panic!("{o:?}"),
            }
            let line = lines
                .lines()
                .find(|l| l.contains("NCCL WARN"))
                .unwrap_or_else(|| panic!("no warning: {lines}"));
            assert!(
                line.contains(&format!("NCCL_NET_PLUGIN={setting}"))
                    && line.contains("using the built-in network"),
                "{line}"
            );
        }
        assert!(matches!(
            load(Some("none")).unwrap().1,
            Outcome::NotFound { .. }
        ));
    }

    #[test]
    fn builtin_socket_goes_through_the_newest_abi() {
        oxccl_net_socket::force_link();
        let b = oxccl_plugin::builtin_nets()
            .into_iter()
            .find(|b| b.name == "Socket")
            .expect("socket net linked in");
        let lib = Lib::Builtin {
            name: b.name,
            symbols: b.abi.expect("exported"),
        };
        let net = ffi::CPlugin::negotiate(&lib, host()).unwrap();
        assert_eq!(net.version(), "v12");
        assert_eq!(net.name(), "oxccl-Socket");
        assert_eq!(builtin(b).unwrap().name(), "Socket");
    }

    /// The socket network's own warnings (here: a stranger at a listener)
    /// go through the logger it was given at `init` and come out in NCCL's
    /// line form, not as bare lines of their own.
    #[test]
    fn socket_net_warnings_take_nccls_line_form() {
        use std::io::Write as _;
        oxccl_net_socket::force_link();
        let b = oxccl_plugin::builtin_nets()
            .into_iter()
            .find(|b| b.name == "Socket")
            .expect("socket net linked in");
        let net = builtin(b).unwrap().probe().unwrap();
        let (h, mut l) = net.listen(0).unwrap();
        let addr = oxccl_net_socket::Handle::decode(&h).unwrap().addr;
        let ((), text) = crate::log::capture_lines(|| {
            use std::io::Read as _;
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&[0x55; 16]).unwrap();
            s.set_nonblocking(true).unwrap();
            // Accept until the listener has dropped the stranger.
            let start = std::time::Instant::now();
            loop {
                assert!(l.accept().unwrap().is_none());
                match s.read(&mut [0u8; 16]) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    _ => break,
                }
                assert!(start.elapsed() < std::time::Duration::from_secs(10));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        let line = text
            .lines()
            .find(|l| l.contains("refused a connection from"))
            .unwrap_or_else(|| panic!("no warning logged:\n{text}"));
        // host:pid:tid [dev] NCCL WARN ... NET/Socket : refused ...
        let (head, rest) = line.split_once(" NCCL WARN ").expect(line);
        let parts: Vec<&str> = head.rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3, "{line}");
        assert_eq!(parts[1], std::process::id().to_string(), "{line}");
        assert!(parts[0].ends_with(" [0]"), "{line}");
        assert!(
            rest.contains("NET/Socket : refused a connection from")
                && rest.contains("not for this listener"),
            "{line}"
        );
        assert!(!text.contains("oxccl net-socket: WARN"), "{text}");
    }
}
