//! GPUDirect for the net transport: whether the network reads and writes
//! the GPU's step slots itself, as NCCL decides it. The plugin must report
//! CUDA pointers in its devices' `ptr_support`, or dma-buf where the GPU
//! can export its memory as one (NCCL_DMABUF_ENABLE, on by default), and
//! the PCIe path between the GPU and each NIC must be no longer than
//! NCCL_NET_GDR_LEVEL allows (PXB by default: GPU and NIC under one PCIe
//! switch tree, never through the CPU). Otherwise the slots stay in host
//! memory the GPU maps. Where every device reports dma-buf and the GPU can
//! export, the slots are registered through `regMrDmaBuf` with a dma-buf
//! of them, as NCCL prefers; else through `regMr` as CUDA memory.

use std::path::Path;

use oxccl_plugin::{NetProperties, PtrType};

use crate::error::{Error, Result};
use crate::topo::{BusId, PciNode, PciPath};

/// NCCL's path types from near to far, as NCCL_NET_GDR_LEVEL names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Loc,
    Pix,
    Pxb,
    Phb,
    Sys,
}

impl Level {
    /// NCCL_NET_GDR_LEVEL: a path name, or NCCL's older integers (0 LOC,
    /// 1 PIX, 2 PXB, 3 PHB, 4 and above SYS). NVLink paths (NVL, NVB, C2C)
    /// are nearer than any PCIe one: GPUDirect only to a NIC on the GPU.
    pub fn parse(s: &str) -> Result<Level> {
        let s = s.trim().to_ascii_uppercase();
        Ok(match s.as_str() {
            "LOC" | "NVL" | "NVB" | "C2C" | "0" => Level::Loc,
            "PIX" | "1" => Level::Pix,
            "PXB" | "PXN" | "2" => Level::Pxb,
            "PHB" | "3" => Level::Phb,
            "SYS" => Level::Sys,
            n if n.parse::<u32>().is_ok_and(|v| v >= 4) => Level::Sys,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "NCCL_NET_GDR_LEVEL={s:?}: expected LOC, PIX, PXB, PHB, SYS or 0-4"
                )))
            }
        })
    }

    /// A topology's path type as a GDR level (NVLink paths are LOC here).
    pub fn of_path(p: crate::topo::policy::PathLevel) -> Level {
        use crate::topo::policy::PathLevel as P;
        match p {
            P::Loc | P::Nvl => Level::Loc,
            P::Pix => Level::Pix,
            P::Pxb => Level::Pxb,
            P::Phb => Level::Phb,
            P::Sys => Level::Sys,
        }
    }

    fn of(path: PciPath) -> Level {
        match path {
            PciPath::Pix => Level::Pix,
            PciPath::Pxb => Level::Pxb,
            PciPath::Phb | PciPath::Node => Level::Phb,
            PciPath::Sys => Level::Sys,
        }
    }
}

/// What was decided, and why, for the INFO log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub on: bool,
    /// Registered through `regMrDmaBuf` (only ever with `on`).
    pub dmabuf: bool,
    pub why: String,
}

impl Decision {
    /// No GPUDirect, for `why`.
    pub fn off(why: String) -> Decision {
        Decision {
            on: false,
            dmabuf: false,
            why,
        }
    }
}

/// The PCIe node of a NIC from the plugin's `pci_path` (a sysfs path whose
/// last component is the function's bus id); None for virtual devices.
fn nic_node(sys: &Path, pci_path: &str) -> Option<PciNode> {
    let last = Path::new(pci_path).file_name()?.to_str()?;
    let bus: BusId = last.parse().ok()?;
    PciNode::read(sys, bus).ok()
}

/// GPUDirect for the devices `props` of a network, for a GPU at `gpu` in
/// the PCIe tree (None: unknown), under `level` (NCCL_NET_GDR_LEVEL, None:
/// unset); `dmabuf`: the GPU can export dma-bufs and NCCL_DMABUF_ENABLE
/// allows them. Every device must qualify, since channels take the devices
/// in turn. A NIC whose place in the tree is unknown counts as SYS.
pub fn decide(
    props: &[NetProperties],
    gpu: Option<&PciNode>,
    level: Option<&str>,
    sys: &Path,
    dmabuf: bool,
) -> Result<Decision> {
    let paths: Vec<Level> = props
        .iter()
        .map(|p| match (gpu, nic_node(sys, &p.pci_path)) {
            (Some(g), Some(n)) => Level::of(crate::topo::pci::path(g, &n)),
            _ => Level::Sys,
        })
        .collect();
    decide_on(props, &paths, level, dmabuf)
}

/// As [`decide`], with each device's path from the GPU given (from a
/// topology file, NCCL_TOPO_FILE).
pub fn decide_on(
    props: &[NetProperties],
    paths: &[Level],
    level: Option<&str>,
    dmabuf: bool,
) -> Result<Decision> {
    let limit = level.map(Level::parse).transpose()?.unwrap_or(Level::Pxb);
    let off = |why: String| Ok(Decision::off(why));
    if props.is_empty() {
        return off("the network has no device".into());
    }
    let takes = |p: &NetProperties, t: PtrType| p.ptr_support & t as i32 != 0;
    let via_dmabuf = dmabuf && props.iter().all(|p| takes(p, PtrType::Dmabuf));
    for (d, p) in props.iter().enumerate() {
        let usable = takes(p, PtrType::Cuda) || (dmabuf && takes(p, PtrType::Dmabuf));
        if !usable {
            let also = if takes(p, PtrType::Dmabuf) {
                " (it takes dma-buf, which this GPU or NCCL_DMABUF_ENABLE=0 rules out)"
            } else {
                ""
            };
            return off(format!(
                "device {d} ({}) does not take CUDA pointers{also}",
                p.name
            ));
        }
        let path = paths.get(d).copied().unwrap_or(Level::Sys);
        if path > limit {
            return off(format!(
                "device {d} ({}) is {path:?} from the GPU, beyond NCCL_NET_GDR_LEVEL {limit:?}",
                p.name
            ));
        }
    }
    Ok(Decision {
        on: true,
        dmabuf: via_dmabuf,
        why: if via_dmabuf {
            format!("every device takes dma-buf within NCCL_NET_GDR_LEVEL {limit:?}: slots registered through regMrDmaBuf")
        } else {
            format!("every device takes CUDA pointers within NCCL_NET_GDR_LEVEL {limit:?}")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(ptr: i32, pci: &str) -> NetProperties {
        NetProperties {
            name: "nic".into(),
            pci_path: pci.into(),
            guid: 0,
            ptr_support: ptr,
            reg_is_global: false,
            speed_mbps: 100_000,
            port: 0,
            latency_us: 0.0,
            max_comms: 1,
            max_recvs: 1,
            max_p2p_bytes: 1 << 30,
        }
    }

    #[test]
    fn levels_parse_as_nccl_names_them() {
        assert_eq!(Level::parse("pxb").unwrap(), Level::Pxb);
        assert_eq!(Level::parse(" SYS ").unwrap(), Level::Sys);
        assert_eq!(Level::parse("3").unwrap(), Level::Phb);
        assert_eq!(Level::parse("5").unwrap(), Level::Sys);
        assert_eq!(Level::parse("NVL").unwrap(), Level::Loc);
        let e = Level::parse("near").unwrap_err().to_string();
        assert!(e.contains("NCCL_NET_GDR_LEVEL") && e.contains("PXB"), "{e}");
    }

    #[test]
    fn cuda_pointers_and_a_short_enough_path_are_both_needed() {
        let none = Path::new("/nonexistent");
        let host = props(PtrType::Host as i32, "");
        let cuda = props(PtrType::Host as i32 | PtrType::Cuda as i32, "");
        let d = decide(&[host], None, Some("SYS"), none, true).unwrap();
        assert!(!d.on && d.why.contains("CUDA pointers"), "{d:?}");
        // A virtual device (no PCI path) is SYS away: off by default, on
        // when the level allows SYS.
        let d = decide(std::slice::from_ref(&cuda), None, None, none, false).unwrap();
        assert!(!d.on && d.why.contains("Sys"), "{d:?}");
        assert!(
            decide(std::slice::from_ref(&cuda), None, Some("SYS"), none, false)
                .unwrap()
                .on
        );
        let d = decide(
            &[cuda.clone(), props(1, "")],
            None,
            Some("SYS"),
            none,
            false,
        )
        .unwrap();
        assert!(!d.on && d.why.contains("device 1"), "{d:?}");
        assert!(decide(&[], None, Some("SYS"), none, true).is_ok_and(|d| !d.on));
        assert!(decide(&[cuda], None, Some("x"), none, false).is_err());
    }

    /// With the paths a topology file gives, GPUDirect follows them.
    #[test]
    fn paths_from_a_topology_file_decide() {
        let cuda = props(PtrType::Host as i32 | PtrType::Cuda as i32, "");
        let two = [cuda.clone(), cuda];
        assert!(
            decide_on(&two, &[Level::Pix, Level::Pxb], None, false)
                .unwrap()
                .on
        );
        let d = decide_on(&two, &[Level::Pix, Level::Sys], None, false).unwrap();
        assert!(!d.on && d.why.contains("device 1"), "{d:?}");
        assert!(
            decide_on(&two, &[Level::Pix, Level::Sys], Some("SYS"), false)
                .unwrap()
                .on
        );
        use crate::topo::policy::PathLevel;
        assert_eq!(Level::of_path(PathLevel::Nvl), Level::Loc);
        assert_eq!(Level::of_path(PathLevel::Phb), Level::Phb);
    }

    /// A device that takes dma-buf qualifies where the GPU can export one
    /// (and NCCL_DMABUF_ENABLE allows), and then registers through it, as
    /// NCCL prefers, even where it also takes CUDA pointers.
    #[test]
    fn dma_buf_takes_the_place_of_cuda_pointers_where_the_gpu_exports() {
        let none = Path::new("/nonexistent");
        let h = PtrType::Host as i32;
        let dma = props(h | PtrType::Dmabuf as i32, "");
        let both = props(h | PtrType::Dmabuf as i32 | PtrType::Cuda as i32, "");
        let cuda = props(h | PtrType::Cuda as i32, "");
        let d = decide(std::slice::from_ref(&dma), None, Some("SYS"), none, true).unwrap();
        assert!(d.on && d.dmabuf && d.why.contains("regMrDmaBuf"), "{d:?}");
        let d = decide(std::slice::from_ref(&dma), None, Some("SYS"), none, false).unwrap();
        assert!(!d.on && d.why.contains("dma-buf"), "{d:?}");
        let d = decide(std::slice::from_ref(&both), None, Some("SYS"), none, true).unwrap();
        assert!(d.on && d.dmabuf, "{d:?}");
        let d = decide(std::slice::from_ref(&both), None, Some("SYS"), none, false).unwrap();
        assert!(d.on && !d.dmabuf, "{d:?}");
        // One device without dma-buf: every slot through regMr as CUDA memory.
        let d = decide(&[both, cuda], None, Some("SYS"), none, true).unwrap();
        assert!(d.on && !d.dmabuf, "{d:?}");
    }
}
