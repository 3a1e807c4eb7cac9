//! Which network interfaces to use, by NCCL's rules.
//!
//! Shared by the bootstrap (in the core) and the socket net plugin, which
//! must not depend on the core: NCCL keeps this logic in one place
//! (`misc/socket.cc`) for the same two users.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

pub mod retry;
pub use retry::Retry;

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

/// NCCL_SOCKET_FAMILY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    #[default]
    Any,
    V4,
    V6,
}

impl Family {
    /// Parses NCCL_SOCKET_FAMILY (`AF_INET`, `AF_INET6`, or unset).
    pub fn parse(s: Option<&str>) -> Result<Family, NetifError> {
        match s.map(str::trim) {
            None | Some("") => Ok(Family::Any),
            Some("AF_INET") => Ok(Family::V4),
            Some("AF_INET6") => Ok(Family::V6),
            Some(other) => Err(NetifError::BadSetting {
                setting: "NCCL_SOCKET_FAMILY",
                value: other.to_string(),
                why: "expected AF_INET or AF_INET6".into(),
            }),
        }
    }

    fn admits(self, a: &IpAddr) -> bool {
        match self {
            Family::Any => true,
            Family::V4 => a.is_ipv4(),
            Family::V6 => a.is_ipv6(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetifError {
    #[error("{setting}={value:?}: {why}")]
    BadSetting {
        setting: &'static str,
        value: String,
        why: String,
    },
    #[error("{setting}={value:?} matches no interface; interfaces here: {available}")]
    NoMatch {
        setting: &'static str,
        value: String,
        available: String,
    },
    #[error(
        "no usable network interface found (interfaces here: {available}); set NCCL_SOCKET_IFNAME"
    )]
    NoneFound { available: String },
    #[error("cannot list network interfaces: {0}")]
    System(String),
}

/// A parsed NCCL_SOCKET_IFNAME: `eth,ib` (prefixes), `^docker,lo`
/// (excluded prefixes), `=eth0` (exact names); `:port` suffixes are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpec {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfSpec {
    pub fn parse(s: &str) -> IfSpec {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(|n| n.split(':').next().unwrap_or("").trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        IfSpec {
            exclude,
            exact,
            names,
        }
    }

    pub fn matches(&self, ifname: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                ifname == n
            } else {
                ifname.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Every address of every interface that is up.
pub fn list() -> Result<Vec<Iface>, NetifError> {
    let all = if_addrs::get_if_addrs().map_err(|e| NetifError::System(e.to_string()))?;
    Ok(all
        .into_iter()
        .filter(|i| !is_link_local(&i.ip()))
        .map(|i| {
            let prefix_len = match &i.addr {
                if_addrs::IfAddr::V4(a) => u32::from(a.netmask).count_ones() as u8,
                if_addrs::IfAddr::V6(a) => u128::from(a.netmask).count_ones() as u8,
            };
            Iface {
                addr: i.ip(),
                name: i.name,
                prefix_len,
            }
        })
        .collect())
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(_) => false,
        // fe80::/10 needs a scope id to be reached; NCCL skips it too.
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn describe(all: &[Iface]) -> String {
    if all.is_empty() {
        return "none".into();
    }
    all.iter()
        .map(|i| format!("{}({})", i.name, i.addr))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Chooses interfaces from `all` by NCCL's rules: the NCCL_SOCKET_IFNAME
/// spec when given (an error naming it if it matches nothing); otherwise
/// interfaces starting with `ib`, then any but `docker*` and `lo`, then
/// `docker*`, then `lo`. At most `max`, IPv4 before IPv6 within an interface.
pub fn choose(
    all: &[Iface],
    ifname: Option<&str>,
    family: Family,
    max: usize,
) -> Result<Vec<Iface>, NetifError> {
    let pick = |spec: &IfSpec| -> Vec<Iface> {
        let mut v: Vec<Iface> = all
            .iter()
            .filter(|i| family.admits(&i.addr) && spec.matches(&i.name))
            .cloned()
            .collect();
        v.sort_by_key(|i| i.addr.is_ipv6());
        v.truncate(max);
        v
    };
    if let Some(s) = ifname.filter(|s| !s.trim().is_empty()) {
        let found = pick(&IfSpec::parse(s));
        if found.is_empty() {
            return Err(NetifError::NoMatch {
                setting: "NCCL_SOCKET_IFNAME",
                value: s.to_string(),
                available: describe(all),
            });
        }
        return Ok(found);
    }
    for spec in ["ib", "^docker,lo", "docker", "lo"] {
        let found = pick(&IfSpec::parse(spec));
        if !found.is_empty() {
            return Ok(found);
        }
    }
    Err(NetifError::NoneFound {
        available: describe(all),
    })
}

/// [`choose`] over the interfaces of this machine.
pub fn find_interfaces(
    ifname: Option<&str>,
    family: Family,
    max: usize,
) -> Result<Vec<Iface>, NetifError> {
    choose(&list()?, ifname, family, max)
}

/// The interface of this machine on the same subnet as `remote` (how NCCL
/// picks the bootstrap interface when only the root's address is known).
pub fn find_for_remote(remote: IpAddr, family: Family) -> Result<Option<Iface>, NetifError> {
    let all = list()?;
    if remote.is_loopback() {
        return Ok(all
            .into_iter()
            .find(|i| i.addr.is_loopback() && i.addr.is_ipv4() == remote.is_ipv4()));
    }
    Ok(all
        .into_iter()
        .find(|i| family.admits(&i.addr) && same_subnet(&i.addr, &remote, i.prefix_len)))
}

pub fn same_subnet(a: &IpAddr, b: &IpAddr, prefix_len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if prefix_len == 0 {
                0
            } else {
                u32::MAX << (32 - prefix_len.min(32) as u32)
            };
            (u32::from(*a) & mask) == (u32::from(*b) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if prefix_len == 0 {
                0
            } else {
                u128::MAX << (128 - prefix_len.min(128) as u32)
            };
            (u128::from(*a) & mask) == (u128::from(*b) & mask)
        }
        _ => false,
    }
}

/// Parses `<ipv4>:<port>`, `[<ipv6>]:<port>` or `<hostname>:<port>`, as
/// NCCL_COMM_ID takes them.
pub fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| {
        format!("{s:?}: expected <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>")
    })?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?}: {port:?} is not a port number"))?;
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: cannot resolve {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?}: {host:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str) -> Iface {
        Iface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            prefix_len: 24,
        }
    }

    #[test]
    fn spec_forms() {
        let s = IfSpec::parse("^docker,lo");
        assert!(
            s.exclude && !s.exact && s.matches("eth0") && !s.matches("lo") && !s.matches("docker0")
        );
        let s = IfSpec::parse("=eth0");
        assert!(s.matches("eth0") && !s.matches("eth01"));
        let s = IfSpec::parse("eth:1,ib");
        assert!(s.matches("eth3") && s.matches("ib0") && !s.matches("lo"));
    }

    #[test]
    fn default_order_prefers_ib_then_not_lo() {
        let all = vec![
            iface("lo", "127.0.0.1"),
            iface("eth0", "10.0.0.1"),
            iface("ib0", "10.1.0.1"),
        ];
        assert_eq!(choose(&all, None, Family::Any, 1).unwrap()[0].name, "ib0");
        assert_eq!(
            choose(&all[..2], None, Family::Any, 1).unwrap()[0].name,
            "eth0"
        );
        assert_eq!(
            choose(&all[..1], None, Family::Any, 1).unwrap()[0].name,
            "lo"
        );
    }

    #[test]
    fn unmatched_setting_is_named() {
        let all = vec![iface("lo", "127.0.0.1")];
        let e = choose(&all, Some("eth9"), Family::Any, 1).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("NCCL_SOCKET_IFNAME") && m.contains("eth9") && m.contains("lo(127.0.0.1)"),
            "{m}"
        );
    }

    #[test]
    fn family_filter() {
        let all = vec![iface("lo", "::1"), iface("lo", "127.0.0.1")];
        assert!(choose(&all, Some("lo"), Family::V6, 4)
            .unwrap()
            .iter()
            .all(|i| i.addr.is_ipv6()));
        assert_eq!(
            choose(&all, Some("lo"), Family::Any, 4).unwrap()[0].addr,
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert!(Family::parse(Some("AF_UNIX"))
            .unwrap_err()
            .to_string()
            .contains("NCCL_SOCKET_FAMILY"));
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_socket_addr("127.0.0.1:5000").unwrap().port(), 5000);
        assert!(parse_socket_addr("[::1]:7").unwrap().is_ipv6());
        assert_eq!(parse_socket_addr("localhost:9").unwrap().port(), 9);
        assert!(parse_socket_addr("nohostport").is_err());
        assert!(same_subnet(
            &"10.0.0.3".parse().unwrap(),
            &"10.0.0.200".parse().unwrap(),
            24
        ));
        assert!(!same_subnet(
            &"10.0.1.3".parse().unwrap(),
            &"10.0.0.200".parse().unwrap(),
            24
        ));
    }
}
