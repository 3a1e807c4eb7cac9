//! PCI addresses and the PCIe path between two devices, read from sysfs.
//!
//! The path types are nvidia-smi's (`nvidia-smi topo -m`), which refine
//! NCCL's (`src/graph/topo.h`): NCCL's PATH_PHB covers both [`PciPath::Phb`]
//! (one host bridge) and [`PciPath::Node`] (two host bridges of one NUMA
//! node).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::TopoError;

/// A PCI function address, `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BusId {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl BusId {
    /// NVML's spelling (eight-digit domain, upper case), which every NVML
    /// version accepts back.
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Sysfs' spelling, which is also the name of the device's directory.
impl fmt::Display for BusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Accepts CUDA's (`0000:1B:00.0`), NVML's (`00000000:1B:00.0`) and sysfs'
/// (`0000:1b:00.0`) spellings, and `1b:00.0` for domain 0.
impl FromStr for BusId {
    type Err = TopoError;

    fn from_str(s: &str) -> Result<BusId, TopoError> {
        let bad = || TopoError::BadBusId(s.to_string());
        let s = s.trim().trim_end_matches('\0');
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let hex = |x: &str, max: u32| {
            u32::from_str_radix(x, 16)
                .ok()
                .filter(|v| *v <= max && !x.is_empty() && x.len() <= 8)
                .ok_or_else(bad)
        };
        Ok(BusId {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xff)? as u8,
            device: hex(device, 0x1f)? as u8,
            function: hex(function, 7)? as u8,
        })
    }
}

/// What lies between two PCI devices, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PciPath {
    /// At most one PCIe switch (NCCL's PATH_PIX).
    Pix,
    /// Several switches, no host bridge (PATH_PXB).
    Pxb,
    /// Through one PCIe host bridge, i.e. the CPU (PATH_PHB).
    Phb,
    /// Between host bridges of one NUMA node (NCCL counts it as PATH_PHB).
    Node,
    /// Across the link between NUMA nodes (PATH_SYS).
    Sys,
}

impl PciPath {
    pub fn as_str(&self) -> &'static str {
        match self {
            PciPath::Pix => "PIX",
            PciPath::Pxb => "PXB",
            PciPath::Phb => "PHB",
            PciPath::Node => "NODE",
            PciPath::Sys => "SYS",
        }
    }
}

impl fmt::Display for PciPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Width and speed of a device's PCIe link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PcieLink {
    /// Transfers per second per lane, in GT/s (32 for Gen5).
    pub gts: f64,
    pub width: u32,
}

impl PcieLink {
    /// Usable GB/s one way. NCCL counts three quarters of the raw rate
    /// (12 GB/s for Gen3 x16): protocol overhead eats the rest.
    pub fn gbps(&self) -> f64 {
        self.gts * f64::from(self.width) * 3.0 / 32.0
    }
}

/// Where a PCI device sits: its host bridge, the chain of bridges from it
/// down to the device, its NUMA node and its link.
#[derive(Debug, Clone, PartialEq)]
pub struct PciNode {
    pub bus_id: BusId,
    /// The host bridge's sysfs name (`pci0000:00`).
    pub root: String,
    /// Every function on the way from the host bridge down, the device last.
    pub chain: Vec<BusId>,
    /// None where the kernel does not know (`numa_node` is -1).
    pub numa: Option<i32>,
    pub link: Option<PcieLink>,
}

impl PciNode {
    /// Reads the device at `bus_id` under the sysfs root `sys` (`/sys`).
    pub fn read(sys: &Path, bus_id: BusId) -> Result<PciNode, TopoError> {
        let link = sys.join("bus/pci/devices").join(bus_id.to_string());
        let real = std::fs::canonicalize(&link).map_err(|e| TopoError::Sysfs {
            path: link.clone(),
            why: e.to_string(),
        })?;
        let (root, chain) = split_device_path(&real).ok_or_else(|| TopoError::Sysfs {
            path: real.clone(),
            why: "not under a PCI host bridge (pciDDDD:BB)".into(),
        })?;
        let numa = read_trimmed(&real.join("numa_node"))
            .and_then(|s| s.parse::<i32>().ok())
            .filter(|n| *n >= 0);
        // A device's own link can train wider than the port above it; the
        // narrower of the two bounds what crosses. Idle GPUs drop their
        // current speed, so the maxima are what count (as NCCL reads them).
        let mut link = read_link(&real);
        if let (Some(l), Some(up)) = (link, real.parent().and_then(read_link)) {
            link = Some(PcieLink {
                gts: l.gts.min(up.gts),
                width: l.width.min(up.width),
            });
        }
        Ok(PciNode {
            bus_id,
            root,
            chain,
            numa,
            link,
        })
    }
}

/// `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0` → (`pci0000:00`,
/// [00:01.0, 01:00.0]); None for a path with no host bridge in it.
pub fn split_device_path(real: &Path) -> Option<(String, Vec<BusId>)> {
    let names: Vec<String> = real
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let at = names.iter().rposition(|n| is_host_bridge(n))?;
    let chain: Vec<BusId> = names[at + 1..]
        .iter()
        .map_while(|n| n.parse().ok())
        .collect();
    (!chain.is_empty()).then(|| (names[at].clone(), chain))
}

fn is_host_bridge(name: &str) -> bool {
    name.strip_prefix("pci").is_some_and(|rest| {
        rest.split_once(':').is_some_and(|(d, b)| {
            !d.is_empty()
                && !b.is_empty()
                && d.chars().chain(b.chars()).all(|c| c.is_ascii_hexdigit())
        })
    })
}

fn read_link(dir: &Path) -> Option<PcieLink> {
    let speed = read_trimmed(&dir.join("max_link_speed"))?;
    let width = read_trimmed(&dir.join("max_link_width"))?.parse().ok()?;
    // "32.0 GT/s PCIe" on recent kernels, "32 GT/s" on old ones.
    let gts = speed.split_whitespace().next()?.parse().ok()?;
    (width > 0).then_some(PcieLink { gts, width })
}

pub(crate) fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The switches a device hangs from, nearest first, as NCCL builds its
/// graph: a switch is its upstream port and each downstream port is folded
/// into it, so going up one switch is going up two functions; the root
/// port is folded into the host bridge.
pub(crate) fn switches(chain: &[BusId]) -> Vec<BusId> {
    let dev = chain.len() - 1;
    (0..dev)
        .rev()
        .skip(1)
        .step_by(2)
        .map(|i| chain[i])
        .collect()
}

/// The path between two devices; pure, so that tests need no hardware.
pub fn path(a: &PciNode, b: &PciNode) -> PciPath {
    if a.root == b.root {
        let (sa, sb) = (switches(&a.chain), switches(&b.chain));
        // Functions of one device, or devices on one bus below a root
        // port's switch: the same switch is the first common one.
        for (i, s) in sa.iter().enumerate() {
            if let Some(j) = sb.iter().position(|t| t == s) {
                return if i == 0 && j == 0 {
                    PciPath::Pix
                } else {
                    PciPath::Pxb
                };
            }
        }
        // Functions of one device straight on a root port share no switch
        // but do not cross the host bridge either.
        if a.chain.len() == b.chain.len()
            && a.chain[..a.chain.len() - 1] == b.chain[..b.chain.len() - 1]
            && same_device(a.bus_id, b.bus_id)
        {
            return PciPath::Pix;
        }
        return PciPath::Phb;
    }
    if a.numa == b.numa {
        PciPath::Node
    } else {
        PciPath::Sys
    }
}

fn same_device(a: BusId, b: BusId) -> bool {
    (a.domain, a.bus, a.device) == (b.domain, b.bus, b.device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::fake::FakeSys;

    fn id(s: &str) -> BusId {
        s.parse().unwrap()
    }

    #[test]
    fn bus_ids_parse_every_spelling() {
        let want = BusId {
            domain: 0,
            bus: 0x1b,
            device: 0,
            function: 0,
        };
        assert_eq!(id("0000:1B:00.0"), want);
        assert_eq!(id("00000000:1B:00.0"), want);
        assert_eq!(id("0000:1b:00.0"), want);
        assert_eq!(id("1b:00.0"), want);
        assert_eq!(want.to_string(), "0000:1b:00.0");
        assert_eq!(want.nvml(), "00000000:1B:00.0");
        for bad in [
            "",
            "1b:00",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "zz:00.0",
            "0:0:0:0.0",
        ] {
            assert!(bad.parse::<BusId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn host_bridge_split() {
        let (root, chain) = split_device_path(Path::new(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
        ))
        .unwrap();
        assert_eq!(root, "pci0000:00");
        assert_eq!(chain, vec![id("00:01.0"), id("01:00.0")]);
        assert!(split_device_path(Path::new("/sys/devices/virtual/net/lo")).is_none());
    }

    /// Two GPUs and a NIC under one switch, a GPU under a second-level
    /// switch, one on another root port, one on another host bridge of
    /// the same NUMA node and one on the other socket.
    fn machine() -> FakeSys {
        let f = FakeSys::new();
        let sw = ["0000:00:01.0", "0000:01:00.0"];
        f.pci(&[sw[0], sw[1], "0000:02:08.0", "0000:03:00.0"], 0);
        f.pci(&[sw[0], sw[1], "0000:02:10.0", "0000:04:00.0"], 0);
        f.pci(&[sw[0], sw[1], "0000:02:18.0", "0000:05:00.0"], 0);
        f.pci(&[sw[0], sw[1], "0000:02:18.0", "0000:05:00.1"], 0);
        f.pci(
            &[
                sw[0],
                sw[1],
                "0000:02:0c.0",
                "0000:06:00.0",
                "0000:07:00.0",
                "0000:08:00.0",
            ],
            0,
        );
        f.pci(&["0000:00:02.0", "0000:09:00.0"], 0);
        f.pci_in("pci0000:40", &["0000:40:01.0", "0000:41:00.0"], 0);
        f.pci_in("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1);
        f
    }

    #[test]
    fn paths_are_classified_as_nvidia_smi_does() {
        let f = machine();
        let n = |s: &str| PciNode::read(f.root(), id(s)).unwrap();
        let gpu = n("0000:03:00.0");
        assert_eq!(path(&gpu, &n("0000:04:00.0")), PciPath::Pix);
        assert_eq!(path(&gpu, &n("0000:05:00.0")), PciPath::Pix);
        assert_eq!(path(&n("0000:05:00.0"), &n("0000:05:00.1")), PciPath::Pix);
        assert_eq!(path(&gpu, &n("0000:08:00.0")), PciPath::Pxb);
        assert_eq!(path(&gpu, &n("0000:09:00.0")), PciPath::Phb);
        assert_eq!(path(&gpu, &n("0000:41:00.0")), PciPath::Node);
        assert_eq!(path(&gpu, &n("0000:81:00.0")), PciPath::Sys);
        // Symmetric, and the classes order from near to far.
        assert_eq!(path(&n("0000:81:00.0"), &gpu), PciPath::Sys);
        assert!(PciPath::Pix < PciPath::Pxb && PciPath::Node < PciPath::Sys);
    }

    #[test]
    fn numa_and_link_width_are_read() {
        let f = machine();
        let far = PciNode::read(f.root(), id("0000:81:00.0")).unwrap();
        assert_eq!(far.numa, Some(1));
        assert_eq!(far.root, "pci0000:80");
        let l = far.link.unwrap();
        assert_eq!((l.gts, l.width), (32.0, 16));
        assert!((l.gbps() - 48.0).abs() < 1e-9);
        // The narrower end wins.
        f.set("devices/pci0000:80/0000:80:01.0/max_link_width", "8\n");
        let far = PciNode::read(f.root(), id("0000:81:00.0")).unwrap();
        assert_eq!(far.link.unwrap().width, 8);
        // An unknown NUMA node is none, not -1.
        f.set(
            "devices/pci0000:80/0000:80:01.0/0000:81:00.0/numa_node",
            "-1\n",
        );
        assert_eq!(
            PciNode::read(f.root(), id("0000:81:00.0")).unwrap().numa,
            None
        );
        assert!(PciNode::read(f.root(), id("0000:99:00.0")).is_err());
    }
}
