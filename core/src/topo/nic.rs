//! Network devices from sysfs: interfaces (`class/net`) and RDMA devices
//! (`class/infiniband`), each placed on the PCI tree where it has a device.

use std::path::Path;

use super::pci::{read_trimmed, split_device_path, BusId, PciNode};

/// An interface of `class/net`.
#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    pub name: String,
    pub kind: NicKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NicKind {
    /// Backed by a PCI function.
    Pci {
        pci: PciNode,
        /// Mbit/s as the driver reports it; None where the kernel says -1
        /// (link down, or a driver such as virtio that does not know).
        speed_mbps: Option<u64>,
    },
    /// No device behind it: loopback, bridge, veth, tunnel...
    Virtual(&'static str),
    /// A device that is not on PCI (a platform NIC, a virtio device
    /// on MMIO).
    Other,
}

/// An RDMA device of `class/infiniband`.
#[derive(Debug, Clone, PartialEq)]
pub struct IbDevice {
    pub name: String,
    pub pci: Option<PciNode>,
    pub ports: Vec<IbPort>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IbPort {
    pub port: u32,
    /// `ACTIVE`, `DOWN`, ... (the number the kernel puts first is dropped).
    pub state: String,
    /// As the kernel writes it: `200 Gb/sec (4X HDR)`.
    pub rate: String,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
}

/// Every interface under `sys/class/net`, sorted by name.
pub fn interfaces(sys: &Path) -> Vec<Nic> {
    let mut v: Vec<Nic> = entries(&sys.join("class/net"))
        .into_iter()
        .map(|name| {
            let dir = sys.join("class/net").join(&name);
            let kind = match pci_of(sys, &dir) {
                Some(Some(pci)) => NicKind::Pci {
                    pci,
                    speed_mbps: read_trimmed(&dir.join("speed"))
                        .and_then(|s| s.parse::<i64>().ok())
                        .and_then(|s| u64::try_from(s).ok()),
                },
                Some(None) => NicKind::Other,
                None => NicKind::Virtual(virtual_kind(&name, &dir)),
            };
            Nic { name, kind }
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Every device under `sys/class/infiniband`, sorted by name.
pub fn rdma_devices(sys: &Path) -> Vec<IbDevice> {
    let base = sys.join("class/infiniband");
    let mut v: Vec<IbDevice> = entries(&base)
        .into_iter()
        .map(|name| {
            let dir = base.join(&name);
            let mut ports: Vec<IbPort> = entries(&dir.join("ports"))
                .into_iter()
                .filter_map(|p| {
                    let pd = dir.join("ports").join(&p);
                    let state = read_trimmed(&pd.join("state")).unwrap_or_default();
                    Some(IbPort {
                        port: p.parse().ok()?,
                        state: state
                            .split_once(": ")
                            .map_or(state.as_str(), |(_, s)| s)
                            .to_string(),
                        rate: read_trimmed(&pd.join("rate")).unwrap_or_default(),
                        link_layer: read_trimmed(&pd.join("link_layer")).unwrap_or_default(),
                    })
                })
                .collect();
            ports.sort_by_key(|p| p.port);
            IbDevice {
                name,
                pci: pci_of(sys, &dir).flatten(),
                ports,
            }
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// None: no `device` link (virtual). Some(None): a device not on PCI.
/// A virtio NIC's device is `virtio0` below the PCI function, so the
/// nearest PCI function above the device is the one taken.
fn pci_of(sys: &Path, class_dir: &Path) -> Option<Option<PciNode>> {
    let real = std::fs::canonicalize(class_dir.join("device")).ok()?;
    let mut p = real.as_path();
    loop {
        let last = p.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(id) = last.and_then(|n| n.parse::<BusId>().ok()) {
            if split_device_path(p).is_some() {
                return Some(PciNode::read(sys, id).ok());
            }
        }
        p = match p.parent() {
            Some(up) => up,
            None => return Some(None),
        };
    }
}

fn virtual_kind(name: &str, dir: &Path) -> &'static str {
    if name == "lo" {
        "loopback"
    } else if dir.join("bridge").is_dir() || name.starts_with("docker") || name.starts_with("br-") {
        "bridge"
    } else if name.starts_with("veth") {
        "veth"
    } else if dir.join("tun_flags").exists() {
        "tun/tap"
    } else {
        "virtual"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::fake::FakeSys;

    #[test]
    fn interfaces_physical_and_virtual() {
        let f = FakeSys::new();
        f.pci(&["0000:00:01.0", "0000:01:00.0"], 0);
        f.pci(&["0000:00:01.0", "0000:01:00.1"], 0);
        f.pci_in("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1);
        f.net("eth0", Some("0000:01:00.0"), "100000");
        f.net("eth1", Some("0000:01:00.1"), "-1");
        f.net("ens9", Some("0000:81:00.0"), "25000");
        f.net("lo", None, "");
        f.net("docker0", None, "-1");
        f.net("veth12ab", None, "10000");
        let all = interfaces(f.root());
        let names: Vec<&str> = all.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["docker0", "ens9", "eth0", "eth1", "lo", "veth12ab"]);
        let get = |n: &str| all.iter().find(|x| x.name == n).unwrap().kind.clone();
        match get("eth0") {
            NicKind::Pci { pci, speed_mbps } => {
                assert_eq!(pci.bus_id.to_string(), "0000:01:00.0");
                assert_eq!(pci.numa, Some(0));
                assert_eq!(speed_mbps, Some(100_000));
            }
            k => panic!("{k:?}"),
        }
        match get("eth1") {
            NicKind::Pci { speed_mbps, .. } => assert_eq!(speed_mbps, None),
            k => panic!("{k:?}"),
        }
        match get("ens9") {
            NicKind::Pci { pci, .. } => assert_eq!(pci.numa, Some(1)),
            k => panic!("{k:?}"),
        }
        assert_eq!(get("lo"), NicKind::Virtual("loopback"));
        assert_eq!(get("docker0"), NicKind::Virtual("bridge"));
        assert_eq!(get("veth12ab"), NicKind::Virtual("veth"));
    }

    #[test]
    fn virtio_device_below_its_pci_function() {
        let f = FakeSys::new();
        let dev = f.pci(&["0000:00:03.0"], -1);
        std::fs::create_dir_all(dev.join("virtio0")).unwrap();
        let dir = f.root().join("class/net/enp0s3");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(dev.join("virtio0"), dir.join("device")).unwrap();
        let all = interfaces(f.root());
        match &all[0].kind {
            NicKind::Pci { pci, speed_mbps } => {
                assert_eq!(pci.bus_id.to_string(), "0000:00:03.0");
                assert_eq!((pci.numa, *speed_mbps), (None, None));
            }
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn rdma_ports() {
        let f = FakeSys::new();
        f.pci(&["0000:00:01.0", "0000:01:00.0"], 0);
        f.ib(
            "mlx5_0",
            "0000:01:00.0",
            &[
                (2, "1: DOWN", "10 Gb/sec (4X SDR)"),
                (1, "4: ACTIVE", "400 Gb/sec (4X NDR)"),
            ],
        );
        let all = rdma_devices(f.root());
        assert_eq!(all.len(), 1);
        let d = &all[0];
        assert_eq!(d.name, "mlx5_0");
        assert_eq!(d.pci.as_ref().unwrap().bus_id.to_string(), "0000:01:00.0");
        assert_eq!(d.ports[0].port, 1);
        assert_eq!(d.ports[0].state, "ACTIVE");
        assert_eq!(d.ports[0].rate, "400 Gb/sec (4X NDR)");
        assert_eq!(d.ports[1].state, "DOWN");
        assert!(rdma_devices(Path::new("/nonexistent")).is_empty());
    }
}
