//! What a GPU communicator takes from the node's topology at creation
//! (NCCL_TOPO_FILE fused over detection, see [`crate::topo::system`]):
//! the node written to NCCL_TOPO_DUMP_FILE, each rank's verdict on P2P
//! with the ranks of its host (NCCL_P2P_LEVEL), and the NICs of each
//! rank's GPU (NCCL_NETDEVS_POLICY, NCCL_CROSS_NIC). Every exchange here
//! is reached by every rank, whatever it failed to learn.

use tracing::{info, warn};

use super::ident::Peers;
use crate::bootstrap::Bootstrap;
use crate::config::Config;
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::topo::policy::{self, CrossNic, NetDevsPolicy, PathLevel};
use crate::topo::system::{self, Node, PluginDev};
use crate::topo::BusId;
use crate::transport::{Locality, NicPlan, P2pPairs};
use oxccl_plugin::Net;

/// The node as this communicator sees it.
pub(super) struct NodeTopo {
    pub node: Node,
    /// The node came from NCCL_TOPO_FILE (fused over detection).
    pub from_file: bool,
    /// Each rank's GPU (None where its driver would not say).
    pub buses: Vec<Option<BusId>>,
    pub rank: usize,
}

impl NodeTopo {
    /// Loads the node, writes it to NCCL_TOPO_DUMP_FILE on rank 0 and
    /// learns every rank's GPU address (one exchange).
    pub fn open(
        bootstrap: &Bootstrap,
        cfg: &Config,
        device: usize,
        rank: usize,
    ) -> Result<NodeTopo> {
        let loaded = system::load(cfg.topo_file.as_deref())?;
        let from_file = loaded.from_file;
        if rank == 0 {
            info!(target: "oxccl::init", "topology: {} ({} GPUs, {} NICs, {} CPUs)", loaded.source,
                loaded.node.gpus().len(), loaded.node.devs.len() - loaded.node.gpus().len(), loaded.node.cpus.len());
            if let Some(p) = cfg
                .topo_dump_file
                .as_deref()
                .filter(|p| !p.trim().is_empty())
            {
                match std::fs::write(p, loaded.tree.write()) {
                    Ok(()) => {
                        info!(target: "oxccl::init", "NCCL_TOPO_DUMP_FILE: the topology written to {p}")
                    }
                    Err(e) => {
                        warn!(target: "oxccl::init", "NCCL_TOPO_DUMP_FILE={p}: {e}; the topology is not written")
                    }
                }
            }
        }
        let mine = Device::get(device)
            .and_then(|d| d.pci_bus_id())
            .unwrap_or_default();
        let all = bootstrap.allgather(mine.as_bytes())?;
        let buses = all
            .iter()
            .map(|b| std::str::from_utf8(b).ok()?.parse().ok())
            .collect();
        Ok(NodeTopo {
            node: loaded.node,
            from_file,
            buses,
            rank,
        })
    }

    /// This rank's verdict on P2P with each rank of its host, logged, and
    /// every rank's, exchanged (one exchange): the pairs either end refused
    /// go through host memory, as do those with a rank that set
    /// NCCL_P2P_DISABLE.
    pub fn p2p_pairs(
        &self,
        bootstrap: &Bootstrap,
        cfg: &Config,
        local: &Locality,
        peers: &Peers,
    ) -> Result<P2pPairs> {
        let (rank, n) = (self.rank, local.hosts.len());
        let level = cfg
            .p2p_level
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(PathLevel::parse)
            .transpose()
            .map_err(|why| Error::InvalidArgument(format!("NCCL_P2P_LEVEL: {why}")))?;
        let node = &self.node;
        let default =
            policy::default_p2p_level(node.cpu_arch(), node.cpu_vendor(), node.gpus().len());
        let mut row = vec![1u8; n];
        if !peers.p2p_disabled.contains(&rank) {
            for p in (0..n).filter(|&p| p != rank && local.hosts[p] == local.hosts[rank]) {
                let path = match (self.buses[rank], self.buses.get(p).copied().flatten()) {
                    (Some(a), Some(b)) => node.gpu_path(a, b),
                    _ => None,
                };
                let (ok, why) = policy::p2p_allowed(path, level, default);
                row[p] = u8::from(ok);
                info!(target: "oxccl::init", "P2P {} -> {}: {} ({why})", local.who(rank), local.who(p),
                    if ok { "on" } else { "off, through host memory" });
            }
        }
        let rows = bootstrap.allgather(&row)?;
        let verdicts: Vec<Vec<bool>> = rows
            .iter()
            .map(|r| r.iter().map(|b| *b != 0).collect())
            .collect();
        Ok(P2pPairs::new(&peers.p2p_disabled, &verdicts))
    }

    /// The network devices of every rank's GPU, worked out on this node
    /// (NCCL's assumption that nodes are alike), logged for this rank.
    pub fn nic_plan(&self, net: &dyn Net, cfg: &Config, local: &Locality) -> Result<NicPlan> {
        let policy = NetDevsPolicy::parse(cfg.netdevs_policy.as_deref().unwrap_or(""))
            .map_err(|why| Error::InvalidArgument(format!("NCCL_NETDEVS_POLICY: {why}")))?;
        let cross = CrossNic::from_setting(cfg.cross_nic)
            .map_err(|why| Error::InvalidArgument(format!("NCCL_CROSS_NIC: {why}")))?;
        let ndev = net.devices()?;
        let devs = (0..ndev)
            .map(|d| {
                net.properties(d)
                    .map(|p| PluginDev::new(&p.name, &p.pci_path, p.speed_mbps.max(0) as u64))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let of = |b: Option<BusId>| b.and_then(|b| self.node.gpu_nets(b, &devs, policy));
        let by_rank: Vec<Vec<usize>> = self
            .buses
            .iter()
            .map(|b| of(*b).map(|g| g.nets).unwrap_or_default())
            .collect();
        let mine = of(self.buses[self.rank]);
        let name = |d: &usize| devs.get(*d).map_or("?", |p| p.name.as_str()).to_string();
        match &mine {
            Some(g) => info!(target: "oxccl::init",
                "NET/{} : rank {} GPU {} takes NICs {:?} in turn by channel (nearest {:?} at {}; NCCL_NETDEVS_POLICY {policy}, NCCL_CROSS_NIC {})",
                net.name(), local.who(self.rank), self.buses[self.rank].map_or("?".into(), |b| b.to_string()),
                g.nets.iter().map(name).collect::<Vec<_>>(), g.local.iter().map(name).collect::<Vec<_>>(), g.path, cfg.cross_nic),
            None => info!(target: "oxccl::init",
                "NET/{} : rank {} takes the {ndev} devices in turn by channel (its GPU is not placed in the topology; NCCL_CROSS_NIC {})",
                net.name(), local.who(self.rank), cfg.cross_nic),
        }
        Ok(NicPlan {
            by_rank,
            local: mine.map(|g| g.local).unwrap_or_default(),
            cross,
        })
    }
}
