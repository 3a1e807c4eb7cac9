//! Devices: which IB ports this network uses and what it tells the core
//! about them, with NCCL's selection rules. The rules are pure functions of
//! what was found (names, ports, sysfs strings) and of the settings, so
//! they are tested without a device; `discover` is the thin part that asks
//! libibverbs.

use std::sync::{Arc, Mutex};

use oxccl_plugin::{NetProperties, PtrType};

use crate::config::Config;
use crate::connection::LocalPort;
use crate::mr::MrCache;
use crate::verbs::{self, Context, Mr, Pd, IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND};

/// Link speed in Mbit/s from `ibv_port_attr`'s `active_speed` and
/// `active_width` bit fields (per-lane rate times lanes), as NCCL computes it.
pub fn port_speed_mbps(active_speed: u8, active_width: u8) -> i32 {
    // Lane rates for bits 0.. of active_speed: SDR, DDR, QDR (two codes),
    // FDR, EDR, HDR, NDR, XDR.
    const SPEEDS: [i32; 9] = [
        2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000,
    ];
    // Lanes for bits 0.. of active_width: 1x, 4x, 8x, 12x, 2x.
    const WIDTHS: [i32; 5] = [1, 4, 8, 12, 2];
    let first = |v: u8, max: usize| (0..max).find(|i| v & (1 << i) != 0).unwrap_or(max);
    SPEEDS[first(active_speed, SPEEDS.len() - 1)] * WIDTHS[first(active_width, WIDTHS.len() - 1)]
}

/// The GID type strings sysfs shows under `ports/N/gid_attrs/types/I`.
pub const ROCE_V2: &str = "RoCE v2";

/// Picks the GID index of a RoCE port when `NCCL_IB_GID_INDEX` is unset, as
/// NCCL does: RoCE v2 before v1, and among those an IPv4-mapped address
/// (`::ffff:a.b.c.d`, routable in the usual IPv4 fabric) first; else index 0.
/// `gids` holds (index, type as sysfs writes it, gid) for the valid entries.
pub fn choose_gid_index(gids: &[(i32, String, [u8; 16])]) -> i32 {
    let v4_mapped =
        |g: &[u8; 16]| g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff;
    let nonzero = |g: &[u8; 16]| g.iter().any(|b| *b != 0);
    let rank = |t: &str, g: &[u8; 16]| match (t.trim() == ROCE_V2, v4_mapped(g)) {
        (true, true) => 0,
        (true, false) => 1,
        (false, true) => 2,
        (false, false) => 3,
    };
    gids.iter()
        .filter(|(_, _, g)| nonzero(g))
        .min_by_key(|(i, t, g)| (rank(t, g), *i))
        .map_or(0, |(i, _, _)| *i)
}

/// Whether GPUDirect RDMA can work: a peer-memory kernel module lets the
/// NIC register GPU memory (the files NCCL checks).
pub fn gdr_module_loaded() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
        "/sys/module/nvidia_peermem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// The PCI device a port belongs to, for merging: the function digit of
/// the path's last component zeroed, so the ports (functions) of one
/// dual-port NIC compare equal, as NCCL merges them.
pub fn nic_key(pci_path: &str) -> Option<String> {
    let mut k = pci_path.to_string();
    k.pop().filter(|c| c.is_ascii_digit())?;
    k.push('0');
    Some(k)
}

/// Which NIC a port belongs to: its PCI device (`nic_key`), or, where sysfs
/// shows no PCI path, its HCA (the ports of one HCA are one NIC).
pub fn port_nic(pci_path: Option<&str>, dev_name: &str) -> Option<String> {
    match pci_path {
        Some(p) => nic_key(p),
        None => Some(format!("hca {dev_name}")),
    }
}

/// Groups ports into virtual devices: with merging on, ports of one NIC
/// (same NIC key, as `port_nic` gives, and link layer) become one device;
/// otherwise each port is its own. Returns indices into `ports`, groups in
/// first-seen order.
pub fn merge_groups(ports: &[(Option<String>, u8)], merge: bool) -> Vec<Vec<usize>> {
    type Key = Option<(String, u8)>;
    let mut groups: Vec<(Key, Vec<usize>)> = Vec::new();
    for (i, (nic, ll)) in ports.iter().enumerate() {
        let key = nic.clone().map(|k| (k, *ll));
        match groups
            .iter_mut()
            .find(|(k, _)| merge && key.is_some() && *k == key)
        {
            Some((_, g)) => g.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Most ports one virtual device merges (NCCL's `NCCL_IB_MAX_DEVS_PER_NIC`).
pub const MAX_PORTS_PER_VDEV: usize = 4;

/// One usable port: the device (shared with the other ports of the same
/// HCA), its protection domain, and what a peer needs to reach it.
///
/// Field order is drop order: the protection domain before the context.
pub struct Port {
    pub pd: Arc<Pd>,
    pub ctx: Arc<Context>,
    pub dev_name: String,
    pub port: u8,
    pub link_layer: u8,
    pub lid: u16,
    pub active_mtu: u8,
    pub gid_index: i32,
    pub gid: [u8; 16],
    pub speed_mbps: i32,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub max_qp: i32,
    /// Whether the port's device registers dma-bufs (`Err`: why not).
    pub dmabuf: Result<(), String>,
}

/// A registration on every port of a device (ports of one HCA share a
/// protection domain, and then the same `Mr`).
pub type PortMrs = Vec<Arc<Mr>>;

impl Port {
    pub fn local(&self) -> LocalPort {
        LocalPort {
            port: self.port,
            link_layer: self.link_layer,
            mtu: self.active_mtu,
            gid_index: self.gid_index,
        }
    }
}

/// A device as the core sees it: one or several ports.
///
/// Field order is drop order: registrations before the ports' protection
/// domains.
pub struct VDev {
    /// Registrations of this device, shared by all its connections.
    pub mrs: Mutex<MrCache<PortMrs>>,
    pub ports: Vec<Port>,
    pub ptr_support: i32,
    /// `Err` says why the device does not report NCCL_PTR_DMABUF.
    pub dmabuf: Result<(), String>,
}

impl VDev {
    /// NCCL's naming: the HCA's name (the port is a property of its own),
    /// and merged devices joined with `+`.
    pub fn name(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for p in &self.ports {
            if !names.contains(&p.dev_name.as_str()) {
                names.push(&p.dev_name);
            }
        }
        names.join("+")
    }

    /// For the log, as NCCL prints it: `mlx5_0:1/IB`, `mlx5_1:1/RoCE`.
    pub fn describe(&self) -> String {
        self.ports
            .iter()
            .map(|p| {
                let ll = if p.link_layer == IBV_LINK_LAYER_ETHERNET {
                    "RoCE"
                } else {
                    "IB"
                };
                format!("{}:{}/{ll}", p.dev_name, p.port)
            })
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Registers `[start, start + len)` on every port's protection domain.
    pub fn register(&self, start: usize, len: usize) -> Result<PortMrs, String> {
        let mut out: PortMrs = Vec::with_capacity(self.ports.len());
        for (i, p) in self.ports.iter().enumerate() {
            let shared = (0..i).find(|j| Arc::ptr_eq(&self.ports[*j].pd, &p.pd));
            let mr = match shared {
                Some(j) => Arc::clone(&out[j]),
                None => Arc::new(p.pd.reg_mr(start, len)?),
            };
            out.push(mr);
        }
        Ok(out)
    }

    /// Registers `len` bytes of dma-buf `fd` (from `offset`), which the NIC
    /// sees at `iova`, on every port's protection domain.
    pub fn register_dmabuf(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
    ) -> Result<PortMrs, String> {
        let mut out: PortMrs = Vec::with_capacity(self.ports.len());
        for (i, p) in self.ports.iter().enumerate() {
            let shared = (0..i).find(|j| Arc::ptr_eq(&self.ports[*j].pd, &p.pd));
            let mr = match shared {
                Some(j) => Arc::clone(&out[j]),
                None => Arc::new(p.pd.reg_dmabuf_mr(offset, len, iova, fd)?),
            };
            out.push(mr);
        }
        Ok(out)
    }

    pub fn properties(&self) -> NetProperties {
        let first = &self.ports[0];
        NetProperties {
            name: self.name(),
            pci_path: first.pci_path.clone().unwrap_or_default(),
            guid: first.guid,
            ptr_support: self.ptr_support,
            // One MR per device (protection domain), shared by its comms.
            reg_is_global: true,
            speed_mbps: self.ports.iter().map(|p| p.speed_mbps).sum(),
            port: first.port as i32,
            latency_us: 0.0,
            max_comms: self
                .ports
                .iter()
                .map(|p| p.max_qp)
                .min()
                .unwrap_or(0)
                .max(1),
            max_recvs: 1,
            max_p2p_bytes: 1 << 31,
        }
    }
}

/// Why no device is usable, for the one INFO line the user sees.
#[derive(Debug, thiserror::Error)]
pub enum NoDevice {
    #[error("NCCL_IB_DISABLE=1: the IB network is off")]
    Disabled,
    #[error("{0}; no IB device (the core uses another network)")]
    NoLibrary(String),
    #[error("libibverbs lists no IB device")]
    NoneListed,
    #[error("no active IB or RoCE port (found: {0})")]
    NoActivePort(String),
    #[error("NCCL_IB_HCA={value:?} selects none of the active ports ({found}); fix or unset NCCL_IB_HCA")]
    HcaMatchesNothing { value: String, found: String },
}

fn read_sys(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn roce_gid_index(ctx: &Context, port: u8, table_len: i32) -> i32 {
    let mut gids = Vec::new();
    for i in 0..table_len.clamp(0, 256) {
        let Ok(g) = ctx.query_gid(port, i) else {
            continue;
        };
        let t = read_sys(&format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{i}",
            ctx.name
        ))
        .unwrap_or_default();
        gids.push((i, t, g.raw));
    }
    choose_gid_index(&gids)
}

/// Opens every device, keeps the active IB/RoCE ports `cfg` selects, and
/// groups them into virtual devices. `Err` says why none is usable; `Ok`
/// may also carry warnings (devices that failed to open, HCA entries that
/// matched nothing) for the caller to log.
pub fn discover(cfg: &Config) -> Result<(Vec<VDev>, Vec<String>), NoDevice> {
    if cfg.disable {
        return Err(NoDevice::Disabled);
    }
    let v = verbs::verbs().map_err(NoDevice::NoLibrary)?;
    let (ctxs, mut warnings) = v.open_all();
    if ctxs.is_empty() {
        return Err(NoDevice::NoneListed);
    }
    let gdr = cfg.gdr_override.unwrap_or_else(gdr_module_loaded);
    let mut found = Vec::new();
    let mut ports = Vec::new();
    for ctx in ctxs {
        let ctx = Arc::new(ctx);
        let attr = match ctx.query_device() {
            Ok(a) => a,
            Err(e) => {
                warnings.push(e);
                continue;
            }
        };
        let pci_path = std::fs::canonicalize(format!("/sys/class/infiniband/{}/device", ctx.name))
            .ok()
            .map(|p| p.display().to_string());
        let mut pd = None;
        let mut dmabuf = Err(String::new());
        for port in 1..=attr.phys_port_cnt {
            let Ok(pa) = ctx.query_port(port) else {
                continue;
            };
            // Ports of other link layers (e.g. Omni-Path's) are not ours.
            let ll = match pa.link_layer {
                IBV_LINK_LAYER_ETHERNET => IBV_LINK_LAYER_ETHERNET,
                verbs::IBV_LINK_LAYER_UNSPECIFIED | IBV_LINK_LAYER_INFINIBAND => {
                    IBV_LINK_LAYER_INFINIBAND
                }
                _ => continue,
            };
            if pa.state != verbs::IBV_PORT_ACTIVE {
                continue;
            }
            found.push((ctx.name.clone(), port));
            if !cfg.hca.selects(&ctx.name, port) {
                continue;
            }
            let pd = match &pd {
                Some(pd) => Arc::clone(pd),
                None => match ctx.alloc_pd() {
                    Ok(p) => {
                        dmabuf = p.dmabuf_supported();
                        Arc::clone(pd.insert(Arc::new(p)))
                    }
                    Err(e) => {
                        warnings.push(e);
                        break;
                    }
                },
            };
            let gid_index = match (ll, cfg.gid_index) {
                (IBV_LINK_LAYER_ETHERNET, Some(i)) => i,
                (IBV_LINK_LAYER_ETHERNET, None) => roce_gid_index(&ctx, port, pa.gid_tbl_len),
                // InfiniBand routes by LID; the GID is kept for NCCL_IB_GID_INDEX users.
                _ => cfg.gid_index.unwrap_or(0),
            };
            let gid = ctx
                .query_gid(port, gid_index)
                .map(|g| g.raw)
                .unwrap_or([0; 16]);
            ports.push(Port {
                ctx: Arc::clone(&ctx),
                pd,
                dev_name: ctx.name.clone(),
                port,
                link_layer: ll,
                lid: pa.lid,
                active_mtu: pa.active_mtu as u8,
                gid_index,
                gid,
                speed_mbps: port_speed_mbps(pa.active_speed, pa.active_width),
                pci_path: pci_path.clone(),
                guid: attr.sys_image_guid,
                max_qp: attr.max_qp,
                dmabuf: dmabuf.clone(),
            });
        }
    }
    let found_text = || {
        if found.is_empty() {
            "none".to_string()
        } else {
            found
                .iter()
                .map(|(d, p)| format!("{d}:{p}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    if found.is_empty() {
        return Err(NoDevice::NoActivePort(found_text()));
    }
    if ports.is_empty() {
        return Err(NoDevice::HcaMatchesNothing {
            value: cfg.hca_raw.clone().unwrap_or_default(),
            found: found_text(),
        });
    }
    if !cfg.hca.exclude {
        for e in cfg.hca.unmatched(&found) {
            warnings.push(format!(
                "NCCL_IB_HCA entry {:?} matches no active port ({})",
                e.name,
                found_text()
            ));
        }
    }
    let keys: Vec<_> = ports
        .iter()
        .map(|p| (port_nic(p.pci_path.as_deref(), &p.dev_name), p.link_layer))
        .collect();
    let mut slots: Vec<Option<Port>> = ports.into_iter().map(Some).collect();
    let ptr_support = PtrType::Host as i32 | if gdr { PtrType::Cuda as i32 } else { 0 };
    let mut vdevs = Vec::new();
    for g in merge_groups(&keys, cfg.merge_nics) {
        for chunk in g.chunks(MAX_PORTS_PER_VDEV) {
            let ports: Vec<Port> = chunk.iter().filter_map(|i| slots[*i].take()).collect();
            // Every port must take the dma-buf, or a registration would fail
            // half-way.
            let dmabuf = ports
                .iter()
                .find_map(|p| {
                    p.dmabuf
                        .clone()
                        .err()
                        .map(|e| format!("{}: {e}", p.dev_name))
                })
                .map_or(Ok(()), Err);
            let ptr_support = ptr_support
                | if dmabuf.is_ok() {
                    PtrType::Dmabuf as i32
                } else {
                    0
                };
            vdevs.push(VDev {
                ports,
                ptr_support,
                dmabuf,
                mrs: Mutex::new(MrCache::default()),
            });
        }
    }
    Ok((vdevs, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HcaEntry, HcaSpec};

    fn sel(spec: &str, dev: &str, port: u8) -> bool {
        HcaSpec::parse(spec).unwrap().selects(dev, port)
    }

    #[test]
    fn hca_prefix_exact_exclude_and_ports() {
        assert!(sel("", "mlx5_0", 1));
        assert!(sel("mlx5", "mlx5_10", 1));
        assert!(
            sel("mlx5_1", "mlx5_10", 1),
            "prefix match is NCCL's default"
        );
        assert!(!sel("=mlx5_1", "mlx5_10", 1));
        assert!(sel("=mlx5_1", "mlx5_1", 2));
        assert!(sel("mlx5_0:1,mlx5_1:2", "mlx5_1", 2));
        assert!(!sel("mlx5_0:1,mlx5_1:2", "mlx5_1", 1));
        assert!(!sel("^mlx5_0", "mlx5_0", 1));
        assert!(sel("^mlx5_0", "mlx5_1", 1));
        assert!(!sel("^=mlx5_0:1", "mlx5_0", 1));
        assert!(sel("^=mlx5_0:1", "mlx5_0", 2));
        assert!(sel("^=mlx5_0:1", "mlx5_00", 1));
        assert!(sel(" mlx5_0 , bnxt_re0 ", "bnxt_re0", 1));
    }

    #[test]
    fn hca_parse_errors_name_the_setting() {
        for bad in ["mlx5_0:x", "mlx5_0:0", ":1", "mlx5_0:999"] {
            let e = HcaSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains("NCCL_IB_HCA"), "{e}");
        }
        let s = HcaSpec::parse("^=a:2,b").unwrap();
        assert!(s.exclude && s.exact);
        assert_eq!(
            s.entries,
            vec![
                HcaEntry {
                    name: "a".into(),
                    port: Some(2)
                },
                HcaEntry {
                    name: "b".into(),
                    port: None
                }
            ]
        );
    }

    #[test]
    fn hca_entries_matching_nothing_are_found() {
        let s = HcaSpec::parse("mlx5_0,foo").unwrap();
        let found = vec![("mlx5_0".to_string(), 1)];
        let u = s.unmatched(&found);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].name, "foo");
    }

    #[test]
    fn speeds_as_nccl_computes_them() {
        // 4x EDR = 100 Gb/s, 4x HDR = 200, 4x NDR = 400, 1x SDR = 2.5.
        assert_eq!(port_speed_mbps(1 << 5, 1 << 1), 100_000);
        assert_eq!(port_speed_mbps(1 << 6, 1 << 1), 200_000);
        assert_eq!(port_speed_mbps(1 << 7, 1 << 1), 400_000);
        assert_eq!(port_speed_mbps(1, 1), 2_500);
        // 2x lanes, and unknown bits falling back to the last entry.
        assert_eq!(port_speed_mbps(1 << 7, 1 << 4), 200_000);
        assert_eq!(port_speed_mbps(0, 0), 200_000 * 2);
    }

    #[test]
    fn gid_choice_prefers_roce_v2_ipv4_mapped() {
        let v4 = {
            let mut g = [0u8; 16];
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&[10, 0, 0, 1]);
            g
        };
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[15] = 1;
        let gids = vec![
            (0, "IB/RoCE v1".to_string(), link_local),
            (1, ROCE_V2.to_string(), link_local),
            (2, "IB/RoCE v1".to_string(), v4),
            (3, ROCE_V2.to_string(), v4),
        ];
        assert_eq!(choose_gid_index(&gids), 3);
        assert_eq!(choose_gid_index(&gids[..3]), 1);
        assert_eq!(choose_gid_index(&gids[..1]), 0);
        assert_eq!(choose_gid_index(&[(5, ROCE_V2.into(), [0; 16])]), 0);
    }

    #[test]
    fn ports_of_one_nic_merge() {
        let p = |s: &str| nic_key(s);
        let ports = vec![
            (p("/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.0"), 1),
            (p("/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.1"), 1),
            (p("/sys/devices/pci0000:00/0000:00:02.0/0000:5e:00.0"), 1),
            (None, 1),
            (p("/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.1"), 2),
        ];
        assert_eq!(
            merge_groups(&ports, true),
            vec![vec![0, 1], vec![2], vec![3], vec![4]]
        );
        assert_eq!(
            merge_groups(&ports, false),
            vec![vec![0], vec![1], vec![2], vec![3], vec![4]]
        );
        assert_eq!(nic_key("x/0000:3b:00.1").as_deref(), Some("x/0000:3b:00.0"));
        // Without a PCI path, the ports of one HCA still merge, and only they.
        let by_hca = vec![
            (port_nic(None, "mlx5_0"), 1),
            (port_nic(None, "mlx5_1"), 1),
            (port_nic(None, "mlx5_0"), 1),
        ];
        assert_eq!(merge_groups(&by_hca, true), vec![vec![0, 2], vec![1]]);
        assert_eq!(nic_key(""), None);
    }
}
