//! NVLinks between GPUs, counted from NVML's view of each link's far end:
//! a GPU (a direct link) or an NVSwitch (every GPU on the switch plane
//! reaches every other).

use std::collections::BTreeMap;

pub use super::nvml::LinkEnd;
use super::nvml::Nvml;
use super::pci::BusId;
use super::TopoError;

/// The active NVLinks of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuNvLinks {
    /// Links straight to another GPU, by that GPU's address.
    pub to_gpu: BTreeMap<BusId, u32>,
    /// Links to NVSwitches.
    pub to_switch: u32,
}

/// The NVLinks of the GPUs asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvLinks {
    pub gpus: BTreeMap<BusId, GpuNvLinks>,
}

impl NvLinks {
    /// Links that carry traffic between `a` and `b`: the direct ones, and
    /// through switches as many as the GPU with fewer switch links has
    /// (NCCL's GPU→NVS→GPU path has the bandwidth of its narrower side).
    pub fn between(&self, a: BusId, b: BusId) -> u32 {
        let (Some(la), Some(lb)) = (self.gpus.get(&a), self.gpus.get(&b)) else {
            return 0;
        };
        let direct = la.to_gpu.get(&b).copied().unwrap_or(0);
        direct + la.to_switch.min(lb.to_switch)
    }

    /// Sorts each GPU's link ends into GPU peers and switches; `is_gpu`
    /// answers for far ends not among `ends` (a GPU hidden from CUDA).
    pub fn from_ends(ends: &[(BusId, Vec<LinkEnd>)], is_gpu: impl Fn(BusId) -> bool) -> NvLinks {
        let mut gpus = BTreeMap::new();
        for (gpu, links) in ends {
            let mut g = GpuNvLinks::default();
            for end in links {
                match end.remote {
                    Some(r) if ends.iter().any(|(b, _)| *b == r) || is_gpu(r) => {
                        *g.to_gpu.entry(r).or_insert(0) += 1;
                    }
                    _ => g.to_switch += 1,
                }
            }
            gpus.insert(*gpu, g);
        }
        NvLinks { gpus }
    }
}

/// Asks NVML about each GPU. A missing NVML is [`TopoError::NoNvml`], for
/// the caller to report as "no NVLink information"; a GPU NVML does not
/// know is left out.
pub fn detect(gpus: &[BusId]) -> Result<NvLinks, TopoError> {
    let nvml = Nvml::shared()?;
    let mut ends = Vec::new();
    for g in gpus {
        match nvml.links(*g) {
            Ok(l) => ends.push((*g, l)),
            Err(e) => {
                tracing::info!(target: "oxccl::init", "NVML on GPU {g}: {e}; its NVLinks are unknown")
            }
        }
    }
    Ok(NvLinks::from_ends(&ends, |b| nvml.is_gpu(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> BusId {
        s.parse().unwrap()
    }

    fn ends(remote: &str, n: u32) -> Vec<LinkEnd> {
        (0..n)
            .map(|link| LinkEnd {
                link,
                remote: Some(id(remote)),
            })
            .collect()
    }

    #[test]
    fn direct_links_between_two_gpus() {
        let (a, b) = (id("0000:1b:00.0"), id("0000:43:00.0"));
        let l = NvLinks::from_ends(
            &[(a, ends("0000:43:00.0", 18)), (b, ends("0000:1b:00.0", 18))],
            |_| false,
        );
        assert_eq!(l.between(a, b), 18);
        assert_eq!(l.between(b, a), 18);
        assert_eq!(l.gpus[&a].to_switch, 0);
        assert_eq!(l.between(a, id("0000:99:00.0")), 0);
    }

    #[test]
    fn switch_links_count_for_every_pair() {
        // An HGX board: each GPU's 18 links go to four switches.
        let gpus = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"];
        let switch_ends = |n: u32| -> Vec<LinkEnd> {
            (0..n)
                .map(|link| LinkEnd {
                    link,
                    remote: Some(id([
                        "0000:05:00.0",
                        "0000:06:00.0",
                        "0000:07:00.0",
                        "0000:08:00.0",
                    ][link as usize % 4])),
                })
                .collect()
        };
        let all: Vec<(BusId, Vec<LinkEnd>)> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| (id(g), switch_ends(if i == 2 { 12 } else { 18 })))
            .collect();
        let l = NvLinks::from_ends(&all, |_| false);
        assert_eq!(l.between(id(gpus[0]), id(gpus[1])), 18);
        // A GPU with links down reaches the others through what it has left.
        assert_eq!(l.between(id(gpus[0]), id(gpus[2])), 12);
    }

    #[test]
    fn unknown_far_ends_count_for_the_pair() {
        // A VM guest: links are up, their far ends not told.
        let (a, b) = (id("0000:00:06.0"), id("0000:00:07.0"));
        let up = |n: u32| (0..n).map(|link| LinkEnd { link, remote: None }).collect();
        let l = NvLinks::from_ends(&[(a, up(18)), (b, up(18))], |_| false);
        assert_eq!(l.between(a, b), 18);
    }

    #[test]
    fn far_gpu_hidden_from_cuda_is_still_a_gpu() {
        let (a, hidden) = (id("0000:1b:00.0"), id("0000:43:00.0"));
        let l = NvLinks::from_ends(&[(a, ends("0000:43:00.0", 4))], |b| b == hidden);
        assert_eq!(l.gpus[&a].to_gpu[&hidden], 4);
        assert_eq!(l.gpus[&a].to_switch, 0);
    }
}
