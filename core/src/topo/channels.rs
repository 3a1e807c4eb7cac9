//! How many channels (thread blocks, each with its own slice of the data)
//! a link between two GPUs wants. NCCL derives its channel count from the
//! bandwidth its graph search finds; here the bandwidth of the link is
//! divided by what one of our blocks carries at best.

use super::pci::PciPath;

/// Thread blocks a collective may use at most (one per multiprocessor of an H100/H200, roughly).
pub const MAX_CHANNELS: usize = 128;

/// What joins two GPUs, for the purpose of moving data between them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Link {
    /// NVLinks, direct or through NVSwitches (the narrower side counted).
    NvLink { links: u32 },
    /// No NVLink: the PCIe path, and the narrower of the two GPUs' PCIe
    /// links in GB/s where sysfs says.
    Pcie { path: PciPath, gbps: Option<f64> },
    /// Nothing known (no sysfs entry, no NVML).
    Unknown,
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Link::NvLink { links } => write!(f, "NV{links}"),
            Link::Pcie {
                path,
                gbps: Some(g),
            } => write!(f, "{path} ({g:.0} GB/s PCIe)"),
            Link::Pcie { path, gbps: None } => write!(f, "{path}"),
            Link::Unknown => write!(f, "unknown"),
        }
    }
}

/// GB/s one way of one NVLink, by compute capability: NCCL's figures
/// (`src/graph/topo.h`, SM*_NVLINK_BW), which match what a copy reaches.
pub fn nvlink_gbps(cc: (i32, i32)) -> f64 {
    match cc {
        (m, _) if m >= 10 => 40.1,
        (9, _) => 20.6,
        (8, 6) | (8, 7) | (8, 9) => 12.0,
        (8, _) | (7, _) => 20.0,
        _ => 18.0,
    }
}

/// PCIe of unknown width and speed: NCCL's default, Gen3 x16.
const PCIE_DEFAULT_GBPS: f64 = 12.0;

/// The link bandwidth each channel stands for: NCCL 2.28.9 gives two H200
/// on NV18 (370.8 GB/s by its figures) 24 channels, 15.45 GB/s each, and
/// oxccl takes no more SMs than NCCL for the same link. (oxccl's kernels
/// reached 364 GB/s all-reduce busbw there on 128 blocks, 291 on 32: at
/// NCCL's count the kernel, not the count, has to catch up.)
const GBPS_PER_CHANNEL: f64 = 15.5;

/// Fewest channels the topology asks for: even a slow link is driven by
/// more than one block, so that one block's stall does not idle it.
pub const MIN_TOPO_CHANNELS: usize = 2;

/// One-way GB/s of a link; None when nothing is known of it.
pub fn link_gbps(link: Link, cc: (i32, i32)) -> Option<f64> {
    match link {
        Link::NvLink { links } => Some(f64::from(links) * nvlink_gbps(cc)),
        // Crossing the host bridge or the socket link is not faster than
        // the GPU's own PCIe link, and usually slower; the GPU's link is the
        // known bound.
        Link::Pcie { gbps, .. } => Some(gbps.unwrap_or(PCIE_DEFAULT_GBPS)),
        Link::Unknown => None,
    }
}

/// Channels for a link between GPUs of compute capability `cc`: one per
/// [`GBPS_PER_CHANNEL`] of its bandwidth, within
/// [`MIN_TOPO_CHANNELS`]..=[`MAX_CHANNELS`]; None when the link is unknown
/// (the caller keeps its default).
pub fn channels(link: Link, cc: (i32, i32)) -> Option<usize> {
    let gbps = link_gbps(link, cc)?;
    let n = (gbps / GBPS_PER_CHANNEL).ceil() as usize;
    Some(n.clamp(MIN_TOPO_CHANNELS, MAX_CHANNELS))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: (i32, i32) = (9, 0);

    #[test]
    fn nv18_on_hopper_takes_nccls_24() {
        assert_eq!(channels(Link::NvLink { links: 18 }, H100), Some(24));
        // Blackwell's links are twice as fast.
        assert_eq!(channels(Link::NvLink { links: 18 }, (10, 0)), Some(47));
    }

    #[test]
    fn fewer_links_fewer_channels() {
        let n = |links| channels(Link::NvLink { links }, H100).unwrap();
        assert_eq!(n(1), 2);
        assert_eq!(n(4), 6);
        assert_eq!(n(12), 16);
        assert!(n(1) < n(4) && n(4) < n(12) && n(12) <= n(18));
        // A link that is down counts as none.
        assert_eq!(n(0), MIN_TOPO_CHANNELS);
    }

    #[test]
    fn pcie_gets_fewer_than_nvlink() {
        let gen5 = Link::Pcie {
            path: PciPath::Pix,
            gbps: Some(48.0),
        };
        let gen4 = Link::Pcie {
            path: PciPath::Sys,
            gbps: Some(24.0),
        };
        let unknown_width = Link::Pcie {
            path: PciPath::Phb,
            gbps: None,
        };
        assert_eq!(channels(gen5, H100), Some(4));
        assert_eq!(channels(gen4, H100), Some(2));
        assert_eq!(channels(unknown_width, H100), Some(MIN_TOPO_CHANNELS));
        assert!(channels(gen5, H100) < channels(Link::NvLink { links: 4 }, H100));
        assert_eq!(channels(Link::Unknown, H100), None);
    }

    #[test]
    fn links_print_as_nvidia_smi_does() {
        assert_eq!(Link::NvLink { links: 18 }.to_string(), "NV18");
        let l = Link::Pcie {
            path: PciPath::Pxb,
            gbps: Some(48.0),
        };
        assert_eq!(l.to_string(), "PXB (48 GB/s PCIe)");
    }
}
