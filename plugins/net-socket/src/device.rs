//! Devices: one per chosen network interface, with NCCL's properties.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use oxccl_netif::{Family, Iface};
use oxccl_plugin::{NetError, NetProperties, PtrType};

/// Most devices (interfaces) the network exposes.
pub const MAX_DEVICES: usize = 16;

/// One device per interface (its first address, IPv4 before IPv6), as NCCL.
pub fn discover(ifname: Option<&str>, family: Family) -> Result<Vec<Iface>, NetError> {
    let mut all = oxccl_netif::find_interfaces(ifname, family, 64)
        .map_err(|e| NetError::InvalidArgument(e.to_string()))?;
    let mut seen = Vec::new();
    all.retain(|i| {
        let new = !seen.contains(&i.name);
        seen.push(i.name.clone());
        new
    });
    all.truncate(MAX_DEVICES);
    Ok(all)
}

pub fn properties(i: &Iface) -> NetProperties {
    let sys = format!("/sys/class/net/{}", i.name);
    let speed = std::fs::read_to_string(format!("{sys}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(10_000);
    let pci_path = std::fs::canonicalize(format!("{sys}/device"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    NetProperties {
        name: i.name.clone(),
        pci_path,
        guid: 0,
        ptr_support: PtrType::Host as i32,
        reg_is_global: true,
        speed_mbps: speed,
        port: 0,
        latency_us: 0.0,
        max_comms: 65536,
        max_recvs: 1,
        max_p2p_bytes: 1 << 40,
    }
}

/// Where a listener on `i` binds. A link-local IPv6 address means nothing
/// without its interface, so it carries the interface index as scope id.
pub fn bind_addr(i: &Iface) -> SocketAddr {
    match i.addr {
        IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => {
            let scope = std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", i.name))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            SocketAddr::V6(SocketAddrV6::new(a, 0, 0, scope))
        }
        a => SocketAddr::new(a, 0),
    }
}
