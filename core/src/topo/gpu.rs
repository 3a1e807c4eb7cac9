//! The GPUs as the CUDA driver numbers them, with their PCI addresses and
//! what the driver says of peer access between each pair.

use std::collections::BTreeMap;

use crate::cuda::{self, Device, P2p};
use crate::error::Result;

use super::pci::BusId;

/// One GPU as CUDA sees it (its ordinal is CUDA's, after
/// `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFacts {
    pub ordinal: usize,
    pub name: String,
    /// None where the driver's answer does not parse (never seen).
    pub bus_id: Option<BusId>,
    pub compute_capability: (i32, i32),
}

/// The driver's answers about every GPU and every ordered pair.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuProbe {
    pub gpus: Vec<GpuFacts>,
    /// By (from, to) ordinal, both orders of every pair.
    pub p2p: BTreeMap<(usize, usize), P2p>,
}

/// Asks the driver; no driver or no GPU is an error for the caller to
/// report.
pub fn probe() -> Result<GpuProbe> {
    let n = cuda::device_count()?;
    let devs: Vec<Device> = (0..n).map(Device::get).collect::<Result<_>>()?;
    let mut gpus = Vec::with_capacity(n);
    for d in &devs {
        gpus.push(GpuFacts {
            ordinal: d.ordinal(),
            name: d.name()?,
            bus_id: d.pci_bus_id()?.parse().ok(),
            compute_capability: d.compute_capability()?,
        });
    }
    let mut p2p = BTreeMap::new();
    for a in &devs {
        for b in devs.iter().filter(|b| b.ordinal() != a.ordinal()) {
            p2p.insert((a.ordinal(), b.ordinal()), a.p2p(b)?);
        }
    }
    Ok(GpuProbe { gpus, p2p })
}
