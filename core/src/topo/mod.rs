//! The node's topology: GPUs (from the CUDA driver), the NVLinks between
//! them (NVML), the PCIe paths between GPUs and NICs (sysfs), and the NICs
//! (`class/net`, `class/infiniband`). Nothing here fails the caller: a
//! missing driver, NVML or sysfs entry leaves that part empty and says why
//! in [`Topology::notes`].
//!
//! The sysfs root is a parameter so that tests build a tree of their own.

pub mod affinity;
pub mod channels;
#[cfg(test)]
mod fake;
pub mod gpu;
pub mod nic;
pub mod nvlink;
mod nvml;
pub mod pci;
pub mod policy;
pub mod system;
pub mod xml;

use std::path::{Path, PathBuf};
use std::sync::Once;

pub use channels::Link;
pub use gpu::{GpuFacts, GpuProbe};
pub use nic::{IbDevice, IbPort, Nic, NicKind};
pub use nvlink::{GpuNvLinks, LinkEnd, NvLinks};
pub use pci::{BusId, PciNode, PciPath, PcieLink};

use crate::cuda::P2p;

/// Why a part of the topology could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopoError {
    #[error("{0:?} is not a PCI address (domain:bus:device.function)")]
    BadBusId(String),
    #[error("{path}: {why}")]
    Sysfs { path: PathBuf, why: String },
    #[error("NVML (libnvidia-ml.so.1) could not be opened: {0}")]
    NoNvml(String),
    #[error("NVML lacks {0}: driver too old")]
    NvmlSymbol(&'static str),
    #[error("{call} failed with NVML error {code}")]
    Nvml { call: &'static str, code: i32 },
}

impl From<TopoError> for crate::Error {
    fn from(e: TopoError) -> Self {
        crate::Error::System(e.to_string())
    }
}

/// One GPU and where it sits.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub facts: GpuFacts,
    /// None where sysfs has no entry for its address (a container without
    /// /sys/bus/pci, or an address that did not parse).
    pub pci: Option<PciNode>,
    /// None where NVML gave nothing (missing, or the GPU unknown to it).
    pub nvlinks: Option<GpuNvLinks>,
}

/// Two GPUs (`a < b`, CUDA ordinals) and what joins them.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPair {
    pub a: usize,
    pub b: usize,
    /// The driver's view from a to b (None without a driver answer).
    pub p2p: Option<P2p>,
    pub link: Link,
}

/// The node as found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    pub gpus: Vec<Gpu>,
    pub pairs: Vec<GpuPair>,
    pub nics: Vec<Nic>,
    pub rdma: Vec<IbDevice>,
    /// What could not be read, and why, one line each.
    pub notes: Vec<String>,
}

impl Topology {
    /// The machine's topology, from `/sys`.
    pub fn detect() -> Topology {
        Topology::detect_in(Path::new("/sys"))
    }

    /// As [`Topology::detect`], with sysfs at `sys`.
    pub fn detect_in(sys: &Path) -> Topology {
        let mut notes = Vec::new();
        let probe = gpu::probe().unwrap_or_else(|e| {
            notes.push(format!("no GPUs: {e}"));
            GpuProbe::default()
        });
        let buses: Vec<BusId> = probe.gpus.iter().filter_map(|g| g.bus_id).collect();
        let nv = if buses.is_empty() {
            NvLinks::default()
        } else {
            nvlinks_or_note(&buses, &mut notes)
        };
        Topology::assemble(probe, &nv, sys, notes)
    }

    /// Puts the driver's and NVML's answers together with what sysfs
    /// says; reads nothing but sysfs, so that tests can feed it.
    pub fn assemble(probe: GpuProbe, nv: &NvLinks, sys: &Path, mut notes: Vec<String>) -> Topology {
        let gpus: Vec<Gpu> = probe
            .gpus
            .into_iter()
            .map(|facts| {
                let pci = facts.bus_id.and_then(|b| match PciNode::read(sys, b) {
                    Ok(n) => Some(n),
                    Err(e) => {
                        notes.push(format!("GPU {}: no PCI placement: {e}", facts.ordinal));
                        None
                    }
                });
                let nvlinks = facts.bus_id.and_then(|b| nv.gpus.get(&b).cloned());
                Gpu {
                    facts,
                    pci,
                    nvlinks,
                }
            })
            .collect();
        let mut pairs = Vec::new();
        for (i, ga) in gpus.iter().enumerate() {
            for gb in &gpus[i + 1..] {
                let (a, b) = (ga.facts.ordinal, gb.facts.ordinal);
                let nvl = match (ga.facts.bus_id, gb.facts.bus_id) {
                    (Some(x), Some(y)) => nv.between(x, y),
                    _ => 0,
                };
                pairs.push(GpuPair {
                    a,
                    b,
                    p2p: probe.p2p.get(&(a, b)).copied(),
                    link: link_of(nvl, ga.pci.as_ref(), gb.pci.as_ref()),
                });
            }
        }
        Topology {
            gpus,
            pairs,
            nics: nic::interfaces(sys),
            rdma: nic::rdma_devices(sys),
            notes,
        }
    }

    /// The pair of GPUs `a` and `b` (CUDA ordinals, either order).
    pub fn pair(&self, a: usize, b: usize) -> Option<&GpuPair> {
        let (a, b) = (a.min(b), a.max(b));
        self.pairs.iter().find(|p| p.a == a && p.b == b)
    }

    /// The PCIe path from GPU `gpu` (index into `gpus`) to a device.
    pub fn path_to(&self, gpu: usize, dev: &PciNode) -> Option<PciPath> {
        Some(pci::path(self.gpus.get(gpu)?.pci.as_ref()?, dev))
    }
}

/// NVLinks where NVML is there; otherwise one INFO line per process and a
/// note, since most machines without NVLink have no reason to have NVML.
fn nvlinks_or_note(buses: &[BusId], notes: &mut Vec<String>) -> NvLinks {
    match nvlink::detect(buses) {
        Ok(nv) => nv,
        Err(e) => {
            static ONCE: Once = Once::new();
            ONCE.call_once(|| {
                tracing::info!(target: "oxccl::init", "no NVLink information: {e}");
            });
            notes.push(format!("no NVLink information: {e}"));
            NvLinks::default()
        }
    }
}

fn link_of(nvlinks: u32, a: Option<&PciNode>, b: Option<&PciNode>) -> Link {
    if nvlinks > 0 {
        return Link::NvLink { links: nvlinks };
    }
    match (a, b) {
        (Some(a), Some(b)) => Link::Pcie {
            path: pci::path(a, b),
            gbps: match (a.link, b.link) {
                (Some(x), Some(y)) => Some(x.gbps().min(y.gbps())),
                _ => None,
            },
        },
        _ => Link::Unknown,
    }
}

/// The channel count for a ring over the GPUs at `ring` (in rank order):
/// the fewest any neighbouring pair's link asks for, with the link that
/// decided it; None when no pair's link is known. Works from addresses, so
/// that ranks of several processes, each seeing only its own GPU through
/// `CUDA_VISIBLE_DEVICES`, agree: NVML and sysfs see every GPU.
pub fn ring_channels(ring: &[BusId], cc: (i32, i32), sys: &Path) -> Option<(usize, Link)> {
    if ring.len() < 2 {
        return None;
    }
    let mut notes = Vec::new();
    let nv = nvlinks_or_note(ring, &mut notes);
    let pairs = if ring.len() == 2 { 1 } else { ring.len() };
    (0..pairs)
        .map(|i| (ring[i], ring[(i + 1) % ring.len()]))
        // Ranks sharing a GPU are joined by its own memory, not a link.
        .filter(|(a, b)| a != b)
        .filter_map(|(a, b)| {
            let link = link_of(
                nv.between(a, b),
                PciNode::read(sys, a).ok().as_ref(),
                PciNode::read(sys, b).ok().as_ref(),
            );
            Some((channels::channels(link, cc)?, link))
        })
        .min_by_key(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fake::FakeSys;

    fn id(s: &str) -> BusId {
        s.parse().unwrap()
    }

    fn facts(ordinal: usize, bus: &str) -> GpuFacts {
        GpuFacts {
            ordinal,
            name: "NVIDIA H100 80GB HBM3".into(),
            bus_id: Some(id(bus)),
            compute_capability: (9, 0),
        }
    }

    /// Four GPUs: 0 and 1 joined by NVLink under one switch, 2 on the
    /// same socket under another host bridge, 3 on the other socket; a
    /// NIC beside GPU 0.
    fn node() -> (FakeSys, GpuProbe, NvLinks) {
        let f = FakeSys::new();
        let sw = ["0000:00:01.0", "0000:01:00.0"];
        f.pci(&[sw[0], sw[1], "0000:02:00.0", "0000:03:00.0"], 0);
        f.pci(&[sw[0], sw[1], "0000:02:01.0", "0000:04:00.0"], 0);
        f.pci(&[sw[0], sw[1], "0000:02:02.0", "0000:05:00.0"], 0);
        f.pci_in("pci0000:40", &["0000:40:01.0", "0000:41:00.0"], 0);
        f.pci_in("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1);
        f.net("ib0", Some("0000:05:00.0"), "400000");
        f.net("lo", None, "");
        let probe = GpuProbe {
            gpus: vec![
                facts(0, "0000:03:00.0"),
                facts(1, "0000:04:00.0"),
                facts(2, "0000:41:00.0"),
                facts(3, "0000:81:00.0"),
            ],
            p2p: BTreeMap::from([(
                (0, 1),
                P2p {
                    access: true,
                    atomics: true,
                    performance_rank: 0,
                },
            )]),
        };
        let ends = |to: &str| -> Vec<LinkEnd> {
            (0..4)
                .map(|link| LinkEnd {
                    link,
                    remote: Some(id(to)),
                })
                .collect()
        };
        let nv = NvLinks::from_ends(
            &[
                (id("0000:03:00.0"), ends("0000:04:00.0")),
                (id("0000:04:00.0"), ends("0000:03:00.0")),
            ],
            |_| false,
        );
        (f, probe, nv)
    }

    use std::collections::BTreeMap;

    #[test]
    fn pairs_nics_and_paths() {
        let (f, probe, nv) = node();
        let t = Topology::assemble(probe, &nv, f.root(), Vec::new());
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert_eq!(t.gpus.len(), 4);
        assert_eq!(t.pairs.len(), 6);
        assert_eq!(t.pair(1, 0).unwrap().link, Link::NvLink { links: 4 });
        assert!(t.pair(0, 1).unwrap().p2p.unwrap().access);
        let pcie = |a, b| match t.pair(a, b).unwrap().link {
            Link::Pcie { path, gbps } => (path, gbps),
            l => panic!("{l:?}"),
        };
        assert_eq!(pcie(0, 2), (PciPath::Node, Some(48.0)));
        assert_eq!(pcie(0, 3).0, PciPath::Sys);
        assert_eq!(pcie(2, 3).0, PciPath::Sys);
        assert_eq!(t.gpus[3].pci.as_ref().unwrap().numa, Some(1));
        let ib = t.nics.iter().find(|n| n.name == "ib0").unwrap();
        let NicKind::Pci { pci, speed_mbps } = &ib.kind else {
            panic!("{ib:?}")
        };
        assert_eq!(*speed_mbps, Some(400_000));
        assert_eq!(t.path_to(0, pci), Some(PciPath::Pix));
        assert_eq!(t.path_to(3, pci), Some(PciPath::Sys));
        assert_eq!(
            t.nics.iter().find(|n| n.name == "lo").unwrap().kind,
            NicKind::Virtual("loopback")
        );
    }

    #[test]
    fn gpu_missing_from_sysfs_is_a_note_not_an_error() {
        let (f, mut probe, nv) = node();
        probe.gpus.push(facts(4, "0000:99:00.0"));
        let t = Topology::assemble(probe, &nv, f.root(), Vec::new());
        assert_eq!(t.notes.len(), 1, "{:?}", t.notes);
        assert!(t.notes[0].starts_with("GPU 4"), "{:?}", t.notes);
        assert_eq!(t.pair(0, 4).unwrap().link, Link::Unknown);
    }

    #[test]
    fn ring_takes_its_slowest_pair() {
        let (f, _, _) = node();
        // No NVML here (or no such GPUs in it): PCIe decides.
        let ring = [id("0000:03:00.0"), id("0000:04:00.0")];
        let (n, link) = ring_channels(&ring, (9, 0), f.root()).unwrap();
        assert_eq!(
            link,
            Link::Pcie {
                path: PciPath::Pix,
                gbps: Some(48.0)
            }
        );
        assert_eq!(n, 4);
        let ring = [id("0000:03:00.0"), id("0000:04:00.0"), id("0000:81:00.0")];
        let (n3, _) = ring_channels(&ring, (9, 0), f.root()).unwrap();
        assert!(n3 <= n);
        assert_eq!(ring_channels(&ring[..1], (9, 0), f.root()), None);
        assert_eq!(ring_channels(&[ring[0], ring[0]], (9, 0), f.root()), None);
        assert_eq!(
            ring_channels(&[id("0000:98:00.0"), id("0000:99:00.0")], (9, 0), f.root()),
            None
        );
    }
}
