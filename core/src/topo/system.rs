//! The node in NCCL's topology format (`NCCL_TOPO_FILE`,
//! `NCCL_TOPO_DUMP_FILE`): a `<system>` of `<cpu>`s (one per NUMA node),
//! each holding the PCIe tree below it as nested `<pci>` elements (a switch
//! is its upstream port, as NCCL folds it), with `<gpu>` (and its
//! `<nvlink>`s) or `<nic>` (and its `<net>`s) in the device's `<pci>`.
//!
//! Detection writes this tree ([`to_xml`]); a file read is fused over it as
//! NCCL fuses one ([`fuse`]): what the file says wins, detection adds the
//! devices and attributes the file leaves out. The decisions (P2P between
//! GPUs, GPUDirect, NICs per GPU, channels) read the result through
//! [`Node`], so that a file changes them as it changes NCCL's.

use std::path::Path;

use super::channels::Link;
use super::pci::{self, BusId, PciPath, PcieLink};
use super::xml::{self, Element};
use super::{NicKind, Topology};

/// NCCL's `NCCL_TOPO_XML_VERSION`.
pub const XML_VERSION: u32 = 1;
/// The class NCCL gives an NVLink whose far end is an NVSwitch, and the
/// target it writes for it.
pub const NVSWITCH_CLASS: &str = "0x068000";
pub const NVSWITCH_TARGET: &str = "fffffff:ffff:ff";
const GPU_CLASS: &str = "0x030200";

/// Why a topology file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error("{path}: {why}")]
    Read { path: String, why: String },
    #[error("{path}: {err}")]
    Xml { path: String, err: xml::XmlError },
    #[error(
        "{path}: {why} (NCCL's topology format: <system version=\"1\"> holding <cpu> elements)"
    )]
    Format { path: String, why: String },
}

impl From<FileError> for crate::Error {
    fn from(e: FileError) -> Self {
        crate::Error::InvalidArgument(format!("NCCL_TOPO_FILE {e}"))
    }
}

/// Parses the text of a topology file (`path` names it in errors).
pub fn parse_file(text: &str, path: &str) -> Result<Element, FileError> {
    let top = xml::parse(text).map_err(|err| FileError::Xml {
        path: path.into(),
        err,
    })?;
    let bad = |why: String| FileError::Format {
        path: path.into(),
        why,
    };
    if top.name != "system" {
        return Err(bad(format!("the top element is <{}>", top.name)));
    }
    match top.attr("version").map(str::parse::<u32>) {
        Some(Ok(XML_VERSION)) => {}
        v => {
            return Err(bad(format!(
                "version {v:?}, NCCL reads version {XML_VERSION}"
            )))
        }
    }
    Ok(top)
}

/// Reads a topology file.
pub fn read_file(path: &Path) -> Result<Element, FileError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| FileError::Read {
        path: p.clone(),
        why: e.to_string(),
    })?;
    parse_file(&text, &p)
}

// ---------------------------------------------------------------- loading

/// Where NCCL looks for a topology file when NCCL_TOPO_FILE is unset.
pub const DEFAULT_FILE: &str = "/var/run/nvidia-topologyd/virtualTopology.xml";

/// Detection's tree and whether NVML answered, once per process: it asks
/// the driver and NVML, and the node does not change under a process.
fn detected() -> &'static (Element, bool) {
    static D: std::sync::OnceLock<(Element, bool)> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let t = Topology::detect();
        let nvml = !t
            .notes
            .iter()
            .any(|n| n.starts_with("no NVLink information"));
        (to_xml(&t, Path::new("/sys")), nvml)
    })
}

/// The node a communicator decides on, the tree it came from and a line
/// saying where from.
pub struct Loaded {
    pub tree: Element,
    pub node: Node,
    pub source: String,
    /// A topology file was read.
    pub from_file: bool,
}

/// The node: NCCL_TOPO_FILE (`file`; unset: [`DEFAULT_FILE`] where it
/// exists) fused over detection, or detection alone. A file named by the
/// setting that cannot be read is an error; the default file, a warning.
pub fn load(file: Option<&str>) -> Result<Loaded, FileError> {
    let (det, nvml) = detected();
    let (path, named) = match file.map(str::trim).filter(|f| !f.is_empty()) {
        Some(f) => (Some(f.to_string()), true),
        None => (
            Path::new(DEFAULT_FILE)
                .exists()
                .then(|| DEFAULT_FILE.to_string()),
            false,
        ),
    };
    let read = path.map(|p| (read_file(Path::new(&p)), p));
    match read {
        Some((Ok(mut top), p)) => {
            fn has_gpu(e: &Element) -> bool {
                e.name == "gpu" || e.children.iter().any(has_gpu)
            }
            // A file that describes GPUs tells their NVLinks too.
            let has_gpus = has_gpu(&top);
            fuse(&mut top, det);
            let node = Node::from_xml(&top, has_gpus || *nvml);
            Ok(Loaded {
                tree: top,
                node,
                source: format!("{p} fused over detection"),
                from_file: true,
            })
        }
        Some((Err(e), _)) if named => Err(e),
        other => {
            if let Some((Err(e), _)) = other {
                tracing::warn!(target: "oxccl::init", "{e}; the topology is detected instead");
            }
            Ok(Loaded {
                tree: det.clone(),
                node: Node::from_xml(det, *nvml),
                source: "detected".into(),
                from_file: false,
            })
        }
    }
}

// ---------------------------------------------------------------- writing

/// The detected node in NCCL's format. `sys` is the sysfs root (class and
/// vendor of each function, the NUMA nodes' CPUs); `/proc/cpuinfo` gives
/// the CPUs' vendor and model where `sys` is `/sys`.
pub fn to_xml(t: &Topology, sys: &Path) -> Element {
    let mut top = Element::new("system");
    top.set("version", XML_VERSION);
    for g in &t.gpus {
        let Some(pn) = &g.pci else { continue };
        let mut dev = pci_element(sys, pn.bus_id, pn.link, GPU_CLASS);
        let gpu = dev.push(Element::new("gpu"));
        gpu.set("dev", g.facts.ordinal);
        let (ma, mi) = g.facts.compute_capability;
        gpu.set("sm", ma * 10 + mi);
        if let Some(nv) = &g.nvlinks {
            for (target, count) in &nv.to_gpu {
                gpu.push(Element::new("nvlink"))
                    .set("target", target)
                    .set("count", count)
                    .set("tclass", GPU_CLASS);
            }
            if nv.to_switch > 0 {
                gpu.push(Element::new("nvlink"))
                    .set("target", NVSWITCH_TARGET)
                    .set("count", nv.to_switch)
                    .set("tclass", NVSWITCH_CLASS);
            }
        }
        place(&mut top, sys, pn, dev);
    }
    // RDMA devices, then interfaces of other PCI functions: what a net
    // plugin would offer, numbered in that order.
    let mut nets: Vec<(&super::PciNode, Element)> = Vec::new();
    for d in &t.rdma {
        let Some(pn) = &d.pci else { continue };
        for p in &d.ports {
            let mut e = Element::new("net");
            e.set("name", &d.name).set("port", p.port);
            if let Some(mbps) = ib_rate_mbps(&p.rate) {
                e.set("speed", mbps);
            }
            nets.push((pn, e));
        }
    }
    for n in &t.nics {
        let NicKind::Pci {
            pci: pn,
            speed_mbps,
        } = &n.kind
        else {
            continue;
        };
        if nets.iter().any(|(q, _)| q.bus_id == pn.bus_id) {
            continue;
        }
        let mut e = Element::new("net");
        e.set("name", &n.name);
        if let Some(s) = speed_mbps {
            e.set("speed", s);
        }
        nets.push((pn, e));
    }
    for (i, (pn, mut net)) in nets.into_iter().enumerate() {
        net.set("dev", i);
        let mut dev = pci_element(sys, pn.bus_id, pn.link, "0x020000");
        dev.push(Element::new("nic")).push(net);
        place(&mut top, sys, pn, dev);
    }
    top
}

/// `400 Gb/sec (4X NDR)` → 400000.
fn ib_rate_mbps(rate: &str) -> Option<u64> {
    let gb: f64 = rate.split_whitespace().next()?.parse().ok()?;
    Some((gb * 1000.0) as u64)
}

fn pci_element(sys: &Path, bus: BusId, link: Option<PcieLink>, class: &str) -> Element {
    let mut e = Element::new("pci");
    e.set("busid", bus);
    let dir = sys.join("bus/pci/devices").join(bus.to_string());
    let read = |f: &str| pci::read_trimmed(&dir.join(f));
    e.set("class", read("class").unwrap_or_else(|| class.to_string()));
    for f in ["vendor", "device", "subsystem_vendor", "subsystem_device"] {
        if let Some(v) = read(f) {
            e.set(f, v);
        }
    }
    match link {
        Some(l) => e
            .set("link_speed", format!("{:.1} GT/s PCIe", l.gts))
            .set("link_width", l.width),
        None => e.set("link_speed", "").set("link_width", ""),
    };
    e
}

/// Puts a device's `<pci>` in the tree: under its CPU, below the switches
/// it hangs from, each created once.
fn place(top: &mut Element, sys: &Path, pn: &super::PciNode, dev: Element) {
    let numa = pn.numa.unwrap_or(-1);
    let at = match top
        .children
        .iter()
        .position(|c| c.name == "cpu" && c.attr("numaid") == Some(&numa.to_string()))
    {
        Some(i) => i,
        None => {
            top.push(cpu_element(sys, numa));
            top.children.len() - 1
        }
    };
    let mut here = &mut top.children[at];
    for sw in pci::switches(&pn.chain).into_iter().rev() {
        let key = sw.to_string();
        let i = match here
            .children
            .iter()
            .position(|c| c.name == "pci" && c.attr("busid") == Some(&key))
        {
            Some(i) => i,
            None => {
                let link = super::PciNode::read(sys, sw).ok().and_then(|n| n.link);
                here.push(pci_element(sys, sw, link, "0x060400"));
                here.children.len() - 1
            }
        };
        here = &mut here.children[i];
    }
    here.children.push(dev);
}

fn cpu_element(sys: &Path, numa: i32) -> Element {
    let mut e = Element::new("cpu");
    e.set("numaid", numa);
    if numa >= 0 {
        let map = sys.join(format!("devices/system/node/node{numa}/cpumap"));
        if let Some(m) = pci::read_trimmed(&map) {
            e.set("affinity", m);
        }
    }
    e.set(
        "arch",
        match std::env::consts::ARCH {
            "aarch64" => "arm64",
            "powerpc64" => "ppc64",
            a => a,
        },
    );
    if sys == Path::new("/sys") {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(k))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        if let Some(v) = field("vendor_id") {
            e.set("vendor", v);
        }
        if let Some(v) = field("cpu family") {
            e.set("familyid", v);
        }
        if let Some(v) = field("model") {
            e.set("modelid", v);
        }
    }
    e
}

// ----------------------------------------------------------------- fusing

/// Fuses `detected` into `file` as NCCL loads a topology file before
/// detecting: every attribute the file gives stays; a device (by `busid`)
/// or a CPU (by `numaid`) the file lacks is added with what detection
/// found, below the deepest of its switches the file has; attributes and
/// links the file leaves out of a device it has are filled in.
pub fn fuse(file: &mut Element, detected: &Element) {
    for cpu in detected.subs("cpu") {
        let numa = cpu.attr("numaid").unwrap_or("-1").to_string();
        if find_mut(file, "cpu", "numaid", &numa).is_none() {
            let mut c = Element::new("cpu");
            c.set("numaid", &numa);
            file.children.push(c);
        }
        let c = find_mut(file, "cpu", "numaid", &numa).expect("made above");
        for (k, v) in &cpu.attrs {
            c.init(k, v);
        }
        let mut chain = Vec::new();
        leaves(cpu, &mut chain, &mut |chain, dev| {
            fuse_device(file, cpu, chain, dev)
        });
    }
}

/// Calls `f` with each device `<pci>` (one with a `<gpu>` or `<nic>`) and
/// the `<pci>` switches above it, top first.
fn leaves<'a>(
    e: &'a Element,
    chain: &mut Vec<&'a Element>,
    f: &mut dyn FnMut(&[&'a Element], &'a Element),
) {
    for c in e.subs("pci") {
        if c.subs("gpu").next().is_some() || c.subs("nic").next().is_some() {
            f(chain, c);
        } else {
            chain.push(c);
            leaves(c, chain, f);
            chain.pop();
        }
    }
}

fn find_mut<'a>(e: &'a mut Element, name: &str, key: &str, val: &str) -> Option<&'a mut Element> {
    if e.name == name && e.attr(key) == Some(val) {
        return Some(e);
    }
    for c in e.children.iter_mut() {
        if let Some(f) = find_mut(c, name, key, val) {
            return Some(f);
        }
    }
    None
}

fn same_bus(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.map(str::parse::<BusId>), b.map(str::parse::<BusId>)) {
        (Some(Ok(x)), Some(Ok(y))) => x == y,
        _ => a.is_some() && a == b,
    }
}

/// The file's spelling of a bus id (NCCL writes lower case, files written
/// by hand may not).
fn file_busid(file: &Element, bus: &str) -> Option<String> {
    fn walk(e: &Element, bus: &str, out: &mut Option<String>) {
        if out.is_some() {
            return;
        }
        if e.name == "pci" && same_bus(e.attr("busid"), Some(bus)) {
            *out = e.attr("busid").map(str::to_string);
            return;
        }
        for c in &e.children {
            walk(c, bus, out);
        }
    }
    let mut out = None;
    walk(file, bus, &mut out);
    out
}

fn fuse_device(file: &mut Element, cpu: &Element, chain: &[&Element], dev: &Element) {
    let bus = dev.attr("busid").unwrap_or_default();
    if let Some(spelled) = file_busid(file, bus) {
        let there = find_mut(file, "pci", "busid", &spelled).expect("found above");
        fill(there, dev);
        return;
    }
    // The deepest switch the file has, else the CPU (made if missing).
    let mut below = chain.len();
    let mut parent = None;
    for (i, sw) in chain.iter().enumerate().rev() {
        if let Some(s) = sw.attr("busid").and_then(|b| file_busid(file, b)) {
            parent = Some(s);
            below = i + 1;
            break;
        }
    }
    let mut sub = dev.clone();
    for sw in chain[below..].iter().rev() {
        let mut s = Element::new("pci");
        s.attrs = sw.attrs.clone();
        s.children.push(sub);
        sub = s;
    }
    let host = match parent {
        Some(p) => find_mut(file, "pci", "busid", &p).expect("found above"),
        None => {
            let numa = cpu.attr("numaid").unwrap_or("-1");
            find_mut(file, "cpu", "numaid", numa).expect("made by fuse")
        }
    };
    host.children.push(sub);
}

/// Fills `dst` (the file's) with what `src` (detection's) adds.
fn fill(dst: &mut Element, src: &Element) {
    for (k, v) in &src.attrs {
        dst.init(k, v);
    }
    for c in &src.children {
        // Children that are one per parent match by name; links by
        // target; nets by name.
        let key = match c.name.as_str() {
            "nvlink" => Some("target"),
            "net" => Some("name"),
            _ => None,
        };
        let i = dst.children.iter().position(|d| {
            d.name == c.name && key.is_none_or(|k| d.attr(k).is_some() && d.attr(k) == c.attr(k))
        });
        match i {
            // A link the file gives is the file's: counts are not summed.
            Some(_) if c.name == "nvlink" => {}
            Some(i) => fill(&mut dst.children[i], c),
            None => dst.children.push(c.clone()),
        }
    }
}

// ------------------------------------------------------------------ model

/// A CPU (NUMA node) of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cpu {
    pub numa: i32,
    pub arch: Option<String>,
    pub vendor: Option<String>,
    pub affinity: Option<String>,
}

/// One NVLink entry of a GPU: its far end and how many links.
#[derive(Debug, Clone, PartialEq)]
pub struct NvLinkTo {
    pub target: String,
    pub count: u32,
    pub tclass: String,
}

/// One network port of a NIC.
#[derive(Debug, Clone, PartialEq)]
pub struct NetPort {
    pub name: String,
    pub dev: Option<u32>,
    pub speed_mbps: Option<u64>,
    pub port: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DevKind {
    Gpu {
        dev: Option<u32>,
        sm: Option<u32>,
        nvlinks: Vec<NvLinkTo>,
    },
    Nic(Vec<NetPort>),
}

/// A GPU or a NIC and where it sits.
#[derive(Debug, Clone, PartialEq)]
pub struct Dev {
    /// None for a NIC straight under a CPU (no PCI function given).
    pub bus: Option<BusId>,
    /// Index into [`Node::cpus`].
    pub cpu: usize,
    /// The switches above it, nearest first.
    pub up: Vec<String>,
    pub link: Option<PcieLink>,
    pub kind: DevKind,
}

/// The node as the decisions read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Node {
    pub cpus: Vec<Cpu>,
    pub devs: Vec<Dev>,
    /// Whether NVLinks are known: a file says what it says; detection
    /// without NVML knows nothing of them, and a decision must not read
    /// "no NVLink" into it.
    pub nvlink_known: bool,
}

fn parse_link(e: &Element) -> Option<PcieLink> {
    let gts = e
        .attr("link_speed")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let width = e.attr("link_width")?.trim().parse().ok()?;
    (width > 0).then_some(PcieLink { gts, width })
}

impl Node {
    /// Reads the tree (a file, detection's, or both fused).
    pub fn from_xml(top: &Element, nvlink_known: bool) -> Node {
        let mut node = Node {
            nvlink_known,
            ..Node::default()
        };
        for c in top.subs("cpu") {
            let ci = node.cpus.len();
            node.cpus.push(Cpu {
                numa: c.attr("numaid").and_then(|v| v.parse().ok()).unwrap_or(-1),
                arch: c.attr("arch").map(str::to_string),
                vendor: c.attr("vendor").map(str::to_string),
                affinity: c.attr("affinity").map(str::to_string),
            });
            for nic in c.subs("nic") {
                node.devs.push(Dev {
                    bus: None,
                    cpu: ci,
                    up: Vec::new(),
                    link: None,
                    kind: DevKind::Nic(nets(nic)),
                });
            }
            node.walk(c, ci, &mut Vec::new());
        }
        node
    }

    fn walk(&mut self, e: &Element, cpu: usize, up: &mut Vec<String>) {
        for p in e.subs("pci") {
            let bus = p.attr("busid").and_then(|b| b.parse().ok());
            let mk = |kind| Dev {
                bus,
                cpu,
                up: up.iter().rev().cloned().collect(),
                link: parse_link(p),
                kind,
            };
            if let Some(g) = p.subs("gpu").next() {
                let num = |k: &str| g.attr(k).and_then(|v| v.trim().parse().ok());
                let nvlinks = g
                    .subs("nvlink")
                    .map(|l| NvLinkTo {
                        target: l.attr("target").unwrap_or_default().to_string(),
                        count: l.attr("count").and_then(|v| v.parse().ok()).unwrap_or(0),
                        tclass: l.attr("tclass").unwrap_or_default().to_string(),
                    })
                    .collect();
                let d = mk(DevKind::Gpu {
                    dev: num("dev"),
                    sm: num("sm"),
                    nvlinks,
                });
                self.devs.push(d);
            }
            for nic in p.subs("nic") {
                let d = mk(DevKind::Nic(nets(nic)));
                self.devs.push(d);
            }
            up.push(p.attr("busid").unwrap_or_default().to_ascii_lowercase());
            self.walk(p, cpu, up);
            up.pop();
        }
    }

    /// The GPU at `bus`.
    pub fn gpu(&self, bus: BusId) -> Option<&Dev> {
        self.devs
            .iter()
            .find(|d| d.bus == Some(bus) && matches!(d.kind, DevKind::Gpu { .. }))
    }

    /// Every GPU, in bus order.
    pub fn gpus(&self) -> Vec<&Dev> {
        let mut v: Vec<&Dev> = self
            .devs
            .iter()
            .filter(|d| matches!(d.kind, DevKind::Gpu { .. }))
            .collect();
        v.sort_by_key(|d| d.bus);
        v
    }

    /// The device (GPU or NIC) at `bus`.
    pub fn dev(&self, bus: BusId) -> Option<&Dev> {
        self.devs.iter().find(|d| d.bus == Some(bus))
    }

    /// The NIC with a port named `name`.
    pub fn nic_named(&self, name: &str) -> Option<&Dev> {
        self.devs.iter().find(
            |d| matches!(&d.kind, DevKind::Nic(ports) if ports.iter().any(|p| p.name == name)),
        )
    }

    /// The PCIe path between two devices, as NCCL types it: one switch
    /// between them (PIX), several (PXB), through the CPU (PHB), across
    /// CPUs (SYS).
    pub fn pci_path(&self, a: &Dev, b: &Dev) -> PciPath {
        if a.cpu != b.cpu {
            return PciPath::Sys;
        }
        if a.bus.is_some() && a.bus == b.bus {
            return PciPath::Pix;
        }
        for (i, s) in a.up.iter().enumerate() {
            if let Some(j) = b.up.iter().position(|t| t == s) {
                return if i == 0 && j == 0 {
                    PciPath::Pix
                } else {
                    PciPath::Pxb
                };
            }
        }
        PciPath::Phb
    }

    /// NVLinks that carry traffic between GPUs `a` and `b`: the direct
    /// ones, and through NVSwitches as many as the side with fewer has.
    pub fn nvlinks(&self, a: &Dev, b: &Dev) -> u32 {
        let links = |d: &Dev| match &d.kind {
            DevKind::Gpu { nvlinks, .. } => nvlinks.clone(),
            _ => Vec::new(),
        };
        let (la, lb) = (links(a), links(b));
        let direct: u32 = la
            .iter()
            .filter(|l| {
                l.tclass != NVSWITCH_CLASS
                    && l.target
                        .parse::<BusId>()
                        .ok()
                        .is_some_and(|t| Some(t) == b.bus)
            })
            .map(|l| l.count)
            .sum();
        let sw = |v: &[NvLinkTo]| -> u32 {
            v.iter()
                .filter(|l| l.tclass == NVSWITCH_CLASS)
                .map(|l| l.count)
                .sum()
        };
        direct + sw(&la).min(sw(&lb))
    }

    /// What joins GPUs `a` and `b`, for the channel count; None where
    /// either is not in the node.
    pub fn gpu_link(&self, a: BusId, b: BusId) -> Option<Link> {
        let (ga, gb) = (self.gpu(a)?, self.gpu(b)?);
        let nv = self.nvlinks(ga, gb);
        if nv > 0 {
            return Some(Link::NvLink { links: nv });
        }
        Some(Link::Pcie {
            path: self.pci_path(ga, gb),
            gbps: match (ga.link, gb.link) {
                (Some(x), Some(y)) => Some(x.gbps().min(y.gbps())),
                _ => None,
            },
        })
    }

    /// The path class between GPUs `a` and `b` for NCCL_P2P_LEVEL; None
    /// where either is not in the node, or where only NVLink could tell
    /// (no NVLink information) and PCIe would say "far".
    pub fn gpu_path(&self, a: BusId, b: BusId) -> Option<super::policy::PathLevel> {
        use super::policy::PathLevel;
        if a == b {
            return Some(PathLevel::Loc);
        }
        match self.gpu_link(a, b)? {
            Link::NvLink { .. } => Some(PathLevel::Nvl),
            Link::Pcie { path, .. } if self.nvlink_known => Some(PathLevel::of(path)),
            Link::Pcie { .. } | Link::Unknown => None,
        }
    }

    /// The CPU vendor of the node (the first CPU's), as NCCL reads it.
    pub fn cpu_vendor(&self) -> Option<&str> {
        self.cpus.first().and_then(|c| c.vendor.as_deref())
    }

    pub fn cpu_arch(&self) -> Option<&str> {
        self.cpus.first().and_then(|c| c.arch.as_deref())
    }
}

/// A device of the net plugin as the NIC choice sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginDev {
    pub name: String,
    /// From the plugin's `pci_path` (its last component); None for a
    /// virtual device.
    pub bus: Option<BusId>,
    pub speed_mbps: u64,
}

impl PluginDev {
    /// From what a net plugin reports of a device.
    pub fn new(name: &str, pci_path: &str, speed_mbps: u64) -> PluginDev {
        PluginDev {
            name: name.to_string(),
            bus: Path::new(pci_path)
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok()),
            speed_mbps,
        }
    }
}

/// The NICs one GPU's channels take in turn, and how they were found.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuNets {
    /// The plugin's device indices; channel `c` takes `nets[c % len]`.
    pub nets: Vec<usize>,
    /// The GPU's nearest devices.
    pub local: Vec<usize>,
    /// Their path type from the GPU.
    pub path: super::policy::PathLevel,
}

impl Node {
    /// Each plugin device's path type from GPU `gpu` (a device the node
    /// does not place counts as SYS, as NCCL's GDR check does).
    pub fn net_candidates(
        &self,
        gpu: &Dev,
        devs: &[PluginDev],
    ) -> Vec<super::policy::NetCandidate> {
        use super::policy::{NetCandidate, PathLevel};
        devs.iter()
            .enumerate()
            .map(|(i, d)| {
                let placed = d
                    .bus
                    .and_then(|b| self.dev(b))
                    .or_else(|| self.nic_named(&d.name));
                NetCandidate {
                    dev: i,
                    path: placed.map_or(PathLevel::Sys, |n| PathLevel::of(self.pci_path(gpu, n))),
                    speed_mbps: d.speed_mbps,
                }
            })
            .collect()
    }

    /// The NICs of GPU `gpu` under `policy` (NCCL_NETDEVS_POLICY); None
    /// where the GPU is not in the node or there is no device.
    pub fn gpu_nets(
        &self,
        gpu: BusId,
        devs: &[PluginDev],
        policy: super::policy::NetDevsPolicy,
    ) -> Option<GpuNets> {
        use super::policy;
        let me = self.gpu(gpu)?;
        let cands = self.net_candidates(me, devs);
        let local = policy::local_nets(&cands);
        let first = *local.first()?;
        // The GPUs that have that NIC among their nearest share it.
        let sharing: Vec<BusId> = self
            .gpus()
            .into_iter()
            .filter(|g| policy::local_nets(&self.net_candidates(g, devs)).contains(&first))
            .filter_map(|g| g.bus)
            .collect();
        let position = sharing.iter().position(|b| *b == gpu).unwrap_or(0);
        Some(GpuNets {
            nets: policy::gpu_nets(&local, sharing.len(), position, policy),
            path: cands[first].path,
            local,
        })
    }
}

fn nets(nic: &Element) -> Vec<NetPort> {
    nic.subs("net")
        .map(|n| NetPort {
            name: n.attr("name").unwrap_or_default().to_string(),
            dev: n.attr("dev").and_then(|v| v.parse().ok()),
            speed_mbps: n.attr("speed").and_then(|v| v.parse().ok()),
            port: n.attr("port").and_then(|v| v.parse().ok()),
        })
        .collect()
}

/// The channel count for a ring over the GPUs at `ring` (rank order) as
/// [`super::ring_channels`], from the node's links.
pub fn ring_channels(node: &Node, ring: &[BusId], cc: (i32, i32)) -> Option<(usize, Link)> {
    if ring.len() < 2 {
        return None;
    }
    let pairs = if ring.len() == 2 { 1 } else { ring.len() };
    (0..pairs)
        .map(|i| (ring[i], ring[(i + 1) % ring.len()]))
        .filter(|(a, b)| a != b)
        .filter_map(|(a, b)| {
            let link = node.gpu_link(a, b)?;
            Some((super::channels::channels(link, cc)?, link))
        })
        .min_by_key(|(n, _)| *n)
}

#[cfg(test)]
mod tests;
