//! Which network a communicator's ranks use between hosts: chosen once per
//! process, with its first communicator (NCCL_NET, NCCL_NET_PLUGIN, the
//! built-in ones), each later communicator taking its own view of it; and
//! the networks this binary links, for `oxccl info`.

use super::*;

/// The network of the communicator `comm_hash`, with its context (v11+),
/// and how the process came to it (for the ranks' check that they all use
/// one network: [`ident::exchange`]). The process chooses the network
/// once, with its first communicator; each later one takes its own view of
/// it ([`Network::for_comm`]).
pub(super) fn comm_net(
    cfg: &Config,
    comm_hash: u64,
    traffic_class: Option<i32>,
) -> Result<(Arc<dyn Net>, String)> {
    static NET: Mutex<Option<(Network, String)>> = Mutex::new(None);
    let mut slot = NET
        .lock()
        .map_err(|_| Error::Internal("network table poisoned".into()))?;
    if let Some((n, how)) = slot.clone() {
        drop(slot);
        return Ok((n.for_comm(comm_hash, traffic_class)?, how));
    }
    // Held while choosing: communicators created meanwhile wait for the choice.
    let (chosen, mine, how) = choose_network(cfg, comm_hash, traffic_class)?;
    *slot = Some((chosen, how.clone()));
    Ok((mine, how))
}

/// The first use of `net`, as NCCL's `ncclNetPluginInit`: `init` with the
/// first communicator's context, then `devices()` once. A network that fails
/// either or has no device is not used; the context made for it is
/// finalized (dropped) here, as NCCL finalizes it.
fn first_use(
    net: &Network,
    comm_hash: u64,
    traffic_class: Option<i32>,
) -> std::result::Result<Arc<dyn Net>, FirstUse> {
    let mine = net
        .for_comm(comm_hash, traffic_class)
        .map_err(FirstUse::Init)?;
    match mine.devices() {
        Ok(n) if n > 0 => Ok(mine),
        Ok(_) => Err(FirstUse::NoDevices),
        Err(e) => Err(FirstUse::Devices(e)),
    }
}

/// Why a network was not taken at its first use.
enum FirstUse {
    Init(NetError),
    NoDevices,
    Devices(NetError),
}

/// Chooses the process's network for its first communicator: the plugin
/// library, else the first built-in with devices (or the one `NCCL_NET`
/// names). Returns the network, that communicator's view of it, and how it
/// came to be chosen ("the plugin …", "built in, as …" with why a plugin
/// was passed over).
fn choose_network(
    cfg: &Config,
    comm_hash: u64,
    traffic_class: Option<i32>,
) -> Result<(Network, Arc<dyn Net>, String)> {
    use crate::plugin::net::Outcome;
    let (plugin, outcome) = crate::plugin::net::load(cfg.net_plugin.as_deref())?;
    // Why a plugin was not taken, for the ranks' comparison of networks.
    let mut passed = Vec::new();
    match (plugin, outcome) {
        (Some(net), Outcome::Loaded { library, .. }) => {
            // NCCL inits only a network whose name NCCL_NET allows.
            let wanted = cfg
                .net
                .as_deref()
                .is_none_or(|w| w.eq_ignore_ascii_case(net.name()));
            if !wanted {
                info!(target: "oxccl::init|net", "net plugin {} not used: NCCL_NET={:?}", net.name(), cfg.net);
                passed.push(format!(
                    "net plugin {} ({library}) not used: NCCL_NET={:?}",
                    net.name(),
                    cfg.net.as_deref().unwrap_or_default()
                ));
            } else {
                match first_use(&net, comm_hash, traffic_class) {
                    Ok(mine) => {
                        info!(target: "oxccl::init|net", "Using network {} (a plugin library, {} device(s))",
                            net.name(), mine.devices().unwrap_or_default());
                        let how = format!("the plugin {library}");
                        return Ok((net, mine, how));
                    }
                    Err(FirstUse::Init(e)) => {
                        let line = net.init_failed_line(&library, &e);
                        warn!(target: "oxccl::init|net", "{line}; using the built-in network");
                        passed.push(line);
                    }
                    Err(FirstUse::NoDevices) => {
                        info!(target: "oxccl::init|net", "net plugin {} not used: 0 device(s)", net.name());
                        passed.push(format!(
                            "net plugin {} ({library}) has 0 devices",
                            net.name()
                        ));
                    }
                    Err(FirstUse::Devices(e)) => {
                        warn!(target: "oxccl::init|net", "net plugin {}: devices() failed: {e}; using the built-in network", net.name());
                        passed.push(format!(
                            "net plugin {} ({library}): devices() failed: {e}",
                            net.name()
                        ));
                    }
                }
            }
        }
        (
            _,
            Outcome::Refused {
                library, reason, ..
            },
        ) => passed.push(format!("net plugin {library}: {reason}")),
        _ => {}
    }
    let how = if passed.is_empty() {
        "built in".to_string()
    } else {
        format!("built in, as {}", passed.join("; "))
    };
    oxccl_net_socket::force_link();
    let builtins = oxccl_plugin::builtin_nets();
    let mut why = Vec::new();
    for b in &builtins {
        if let Some(want) = cfg.net.as_deref() {
            if !b.name.eq_ignore_ascii_case(want) {
                continue;
            }
        }
        let net = match crate::plugin::net::builtin(b) {
            Ok(net) => net,
            Err(e) => {
                why.push(format!("{}: {e}", b.name));
                continue;
            }
        };
        match first_use(&net, comm_hash, traffic_class) {
            Ok(mine) => {
                info!(target: "oxccl::init|net", "Using network {} (built in, {} device(s))",
                    b.name, mine.devices().unwrap_or_default());
                return Ok((net, mine, how));
            }
            Err(FirstUse::Init(e)) => why.push(format!("{}: init failed: {e}", b.name)),
            Err(FirstUse::NoDevices) => why.push(format!("{}: no devices", b.name)),
            Err(FirstUse::Devices(e)) => why.push(format!("{}: {e}", b.name)),
        }
    }
    let names: Vec<&str> = builtins.iter().map(|b| b.name).collect();
    Err(match cfg.net.as_deref() {
        Some(want) if !names.iter().any(|n| n.eq_ignore_ascii_case(want)) => {
            Error::InvalidArgument(format!(
                "NCCL_NET={want:?} matches no network; available: {}",
                names.join(", ")
            ))
        }
        _ => Error::System(format!("no usable network: {}", why.join("; "))),
    })
}

/// One line per network linked into this binary, with its devices, for
/// `oxccl info`. Each v11+ network is looked at through a context made for
/// the purpose and finalized right after.
pub fn net_summary() -> Vec<String> {
    oxccl_net_socket::force_link();
    oxccl_plugin::builtin_nets()
        .into_iter()
        .map(|b| match crate::plugin::net::builtin(b) {
            Ok(net) => match crate::plugin::net::devices_line(&net) {
                Ok(line) => format!("{} (built in): {line}", b.name),
                Err(e) => format!("{} (built in): {e}", b.name),
            },
            Err(e) => format!("{} (built in): cannot start: {e}", b.name),
        })
        .collect()
}
