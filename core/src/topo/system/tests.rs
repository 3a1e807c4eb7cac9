//! The topology format read and written, and what oxccl derives from a
//! DGX H100/H200-like node described in it (`fixtures/dgx-h200.xml`).

use super::*;
use crate::topo::policy::{self, NetDevsPolicy, PathLevel};
use crate::topo::{Gpu, GpuFacts, GpuNvLinks, PciNode};

const DGX: &str = include_str!("../fixtures/dgx-h200.xml");
const GPUS: [&str; 8] = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
];

fn id(s: &str) -> BusId {
    s.parse().unwrap()
}

fn dgx() -> Node {
    Node::from_xml(&parse_file(DGX, "dgx-h200.xml").unwrap(), true)
}

/// The plugin's devices as an IB plugin lists them on that node.
fn mlx5(node: &Node) -> Vec<PluginDev> {
    node.devs
        .iter()
        .filter_map(|d| match &d.kind {
            DevKind::Nic(ports) => Some(PluginDev::new(
                &ports[0].name,
                &format!("/sys/devices/pci0000:00/{}", d.bus.unwrap()),
                ports[0].speed_mbps.unwrap(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn dgx_file_reads_as_eight_gpus_eight_nics_two_cpus() {
    let n = dgx();
    assert_eq!(n.cpus.len(), 2);
    assert_eq!(n.cpus[1].numa, 1);
    assert_eq!(n.cpu_vendor(), Some("GenuineIntel"));
    let gpus: Vec<String> = n
        .gpus()
        .iter()
        .map(|g| g.bus.unwrap().to_string())
        .collect();
    assert_eq!(gpus, GPUS);
    assert_eq!(mlx5(&n).len(), 8);
    let g0 = n.gpu(id(GPUS[0])).unwrap();
    assert_eq!(g0.up, ["0000:16:00.0", "0000:15:00.0"]);
    assert_eq!(g0.link.unwrap().gbps(), 48.0);
}

#[test]
fn dgx_gpus_pair_with_the_nic_under_their_switch() {
    let n = dgx();
    let devs = mlx5(&n);
    for (i, g) in GPUS.iter().enumerate() {
        let got = n.gpu_nets(id(g), &devs, NetDevsPolicy::Auto).unwrap();
        assert_eq!(got.nets, vec![i], "GPU {g}");
        assert_eq!(got.path, PathLevel::Pix);
        // ALL takes nothing more: the GPU has one nearest NIC.
        let all = n.gpu_nets(id(g), &devs, NetDevsPolicy::All).unwrap();
        assert_eq!(all.nets, vec![i]);
    }
    // The paths from GPU 0 to the others' NICs, near to far.
    let g0 = n.gpu(id(GPUS[0])).unwrap();
    let paths: Vec<PathLevel> = n.net_candidates(g0, &devs).iter().map(|c| c.path).collect();
    use PathLevel::*;
    assert_eq!(paths, [Pix, Pxb, Phb, Phb, Sys, Sys, Sys, Sys]);
}

#[test]
fn dgx_gpus_are_p2p_over_nvlink_with_nccls_24_channels() {
    let n = dgx();
    let default = policy::default_p2p_level(n.cpu_arch(), n.cpu_vendor(), 8);
    assert_eq!(default, PathLevel::Pxb);
    for a in GPUS {
        for b in GPUS {
            let path = n.gpu_path(id(a), id(b)).unwrap();
            assert_eq!(
                path,
                if a == b {
                    PathLevel::Loc
                } else {
                    PathLevel::Nvl
                }
            );
            assert!(policy::p2p_allowed(Some(path), None, default).0);
            // NCCL_P2P_LEVEL=LOC (or NCCL_P2P_DISABLE) turns it off.
            let loc = policy::p2p_allowed(Some(path), Some(PathLevel::Loc), default).0;
            assert_eq!(loc, a == b);
        }
    }
    assert_eq!(
        n.gpu_link(id(GPUS[0]), id(GPUS[7])),
        Some(Link::NvLink { links: 18 })
    );
    let ring: Vec<BusId> = GPUS.iter().map(|g| id(g)).collect();
    let (ch, link) = ring_channels(&n, &ring, (9, 0)).unwrap();
    assert_eq!((ch, link), (24, Link::NvLink { links: 18 }));
}

#[test]
fn dgx_without_nvlink_falls_back_to_pcie_paths() {
    let text: String = DGX
        .lines()
        .filter(|l| !l.contains("<nvlink"))
        .collect::<Vec<_>>()
        .join("\n");
    let n = Node::from_xml(&parse_file(&text, "pcie.xml").unwrap(), true);
    let p = |a: usize, b: usize| n.gpu_path(id(GPUS[a]), id(GPUS[b])).unwrap();
    assert_eq!(p(0, 1), PathLevel::Pxb);
    assert_eq!(p(0, 2), PathLevel::Phb);
    assert_eq!(p(0, 4), PathLevel::Sys);
    let default = policy::default_p2p_level(n.cpu_arch(), n.cpu_vendor(), 8);
    let ok = |a, b, level| policy::p2p_allowed(Some(p(a, b)), level, default).0;
    assert!(ok(0, 1, None) && !ok(0, 2, None) && !ok(0, 4, None));
    assert!(ok(0, 2, Some(PathLevel::Phb)) && !ok(0, 4, Some(PathLevel::Phb)));
    assert!(ok(0, 4, Some(PathLevel::Sys)));
    assert!(!ok(0, 1, Some(PathLevel::Nvl)));
    // Gen5 x16 between them: 4 channels.
    let ring = [id(GPUS[0]), id(GPUS[1])];
    assert_eq!(ring_channels(&n, &ring, (9, 0)).unwrap().0, 4);
    // Without NVLink information, a far PCIe path is not read as "no
    // NVLink": the decision keeps its default.
    let blind = Node {
        nvlink_known: false,
        ..n
    };
    assert_eq!(blind.gpu_path(id(GPUS[0]), id(GPUS[4])), None);
}

#[test]
fn two_gpus_share_two_nics_by_policy() {
    // GPUs 0 and 1 under one switch with NICs A and B.
    let t = r#"<system version="1"><cpu numaid="0" arch="x86_64">
      <pci busid="0000:10:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
        <pci busid="0000:11:00.0"><gpu dev="0" sm="90"/></pci>
        <pci busid="0000:12:00.0"><gpu dev="1" sm="90"/></pci>
        <pci busid="0000:13:00.0"><nic><net name="A" dev="0" speed="200000"/></nic></pci>
        <pci busid="0000:14:00.0"><nic><net name="B" dev="1" speed="200000"/></nic></pci>
      </pci></cpu></system>"#;
    let n = Node::from_xml(&parse_file(t, "t").unwrap(), true);
    let devs = vec![
        PluginDev::new("A", "/sys/x/0000:13:00.0", 200_000),
        PluginDev::new("B", "/sys/x/0000:14:00.0", 200_000),
        PluginDev::new("lo", "", 10_000),
    ];
    let nets = |g: &str, p| n.gpu_nets(id(g), &devs, p).unwrap().nets;
    assert_eq!(nets("0000:11:00.0", NetDevsPolicy::Auto), vec![0]);
    assert_eq!(nets("0000:12:00.0", NetDevsPolicy::Auto), vec![1]);
    assert_eq!(nets("0000:11:00.0", NetDevsPolicy::All), vec![0, 1]);
    assert_eq!(nets("0000:12:00.0", NetDevsPolicy::Max(2)), vec![1, 0]);
    assert_eq!(nets("0000:12:00.0", NetDevsPolicy::Max(1)), vec![1]);
}

#[test]
fn a_file_written_reads_back_the_same() {
    let top = parse_file(DGX, "dgx").unwrap();
    let again = parse_file(&top.write(), "again").unwrap();
    assert_eq!(again, top);
    assert_eq!(Node::from_xml(&again, true), dgx());
}

#[test]
fn files_nccl_refuses_are_refused() {
    assert!(matches!(
        parse_file("<system version=\"2\"/>", "v2"),
        Err(FileError::Format { .. })
    ));
    assert!(matches!(
        parse_file("<topo version=\"1\"/>", "t"),
        Err(FileError::Format { .. })
    ));
    let e = parse_file("<system version=\"1\">\n<cpu>", "cut.xml").unwrap_err();
    assert!(e.to_string().starts_with("cut.xml: line 2"), "{e}");
    let e = crate::Error::from(read_file(Path::new("/nonexistent/t.xml")).unwrap_err());
    assert!(e.to_string().contains("NCCL_TOPO_FILE"), "{e}");
}

/// Detection's tree in NCCL's format, from a fake sysfs: GPUs under their
/// switches with their NVLinks, NICs beside them, CPUs by NUMA node.
#[test]
fn detection_writes_nccls_format() {
    let f = crate::topo::fake::FakeSys::new();
    let sw = ["0000:00:01.0", "0000:01:00.0"];
    f.pci(&[sw[0], sw[1], "0000:02:00.0", "0000:03:00.0"], 0);
    f.pci(&[sw[0], sw[1], "0000:02:01.0", "0000:04:00.0"], 0);
    f.pci_in("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1);
    f.set("bus/pci/devices/0000:03:00.0/class", "0x030200\n");
    f.ib(
        "mlx5_0",
        "0000:04:00.0",
        &[(1, "4: ACTIVE", "400 Gb/sec (4X NDR)")],
    );
    f.set("devices/system/node/node1/cpumap", "ffff0000\n");
    let gpu = |ordinal, bus: &str, to_gpu: &[(&str, u32)], to_switch| Gpu {
        facts: GpuFacts {
            ordinal,
            name: "H200".into(),
            bus_id: Some(id(bus)),
            compute_capability: (9, 0),
        },
        pci: PciNode::read(f.root(), id(bus)).ok(),
        nvlinks: Some(GpuNvLinks {
            to_gpu: to_gpu.iter().map(|(b, n)| (id(b), *n)).collect(),
            to_switch,
        }),
    };
    let t = Topology {
        gpus: vec![
            gpu(0, "0000:03:00.0", &[("0000:81:00.0", 4)], 0),
            gpu(1, "0000:81:00.0", &[("0000:03:00.0", 4)], 0),
        ],
        rdma: crate::topo::nic::rdma_devices(f.root()),
        ..Topology::default()
    };
    let top = to_xml(&t, f.root());
    let text = top.write();
    assert!(
        text.contains("<cpu numaid=\"1\" affinity=\"ffff0000\""),
        "{text}"
    );
    assert!(
        text.contains("<nvlink target=\"0000:81:00.0\" count=\"4\" tclass=\"0x030200\"/>"),
        "{text}"
    );
    assert!(
        text.contains("<net name=\"mlx5_0\" port=\"1\" speed=\"400000\" dev=\"0\"/>"),
        "{text}"
    );
    assert!(text.contains("class=\"0x030200\""), "{text}");
    let n = Node::from_xml(&parse_file(&text, "dump").unwrap(), true);
    assert_eq!(
        n.gpu_path(id("0000:03:00.0"), id("0000:81:00.0")),
        Some(PathLevel::Nvl)
    );
    // The GPU on the switch at 01:00.0 and the NIC beside it.
    let g0 = n.gpu(id("0000:03:00.0")).unwrap();
    assert_eq!(g0.up, ["0000:01:00.0"]);
    let devs = [PluginDev::new("mlx5_0", "/x/0000:04:00.0", 400_000)];
    assert_eq!(n.net_candidates(g0, &devs)[0].path, PathLevel::Pix);
    let g1 = n.gpu(id("0000:81:00.0")).unwrap();
    assert_eq!(n.net_candidates(g1, &devs)[0].path, PathLevel::Sys);
}

/// A file fused over detection keeps what it says and gains what it
/// leaves out, as NCCL loads NCCL_TOPO_FILE before detecting.
#[test]
fn file_wins_detection_fills_in() {
    let mut file = parse_file(
        r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
          <pci busid="0000:10:00.0" class="0x060400">
            <pci busid="0000:11:00.0" class="0x030200" link_speed="16.0 GT/s PCIe"><gpu dev="0" sm="80"/></pci>
          </pci></cpu></system>"#,
        "file",
    )
    .unwrap();
    let detected = parse_file(
        r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" affinity="ff">
          <pci busid="0000:10:00.0" class="0x060400">
            <pci busid="0000:11:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
              <gpu dev="0" sm="90"><nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/></gpu>
            </pci>
            <pci busid="0000:12:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="400000"/></nic></pci>
          </pci></cpu>
          <cpu numaid="1" arch="x86_64"><pci busid="0000:80:00.0" class="0x060400">
            <pci busid="0000:81:00.0" class="0x030200"><gpu dev="1" sm="90"/></pci></pci></cpu></system>"#,
        "detected",
    )
    .unwrap();
    fuse(&mut file, &detected);
    let n = Node::from_xml(&file, true);
    // The file's vendor and speeds stay; the width and the affinity come in.
    assert_eq!(n.cpu_vendor(), Some("AuthenticAMD"));
    assert_eq!(n.cpus[0].affinity.as_deref(), Some("ff"));
    let g = n.gpu(id("0000:11:00.0")).unwrap();
    assert_eq!(
        g.link,
        Some(PcieLink {
            gts: 16.0,
            width: 16
        })
    );
    assert!(matches!(&g.kind, DevKind::Gpu { sm: Some(80), nvlinks, .. } if nvlinks.len() == 1));
    // The NIC goes under the switch the file has; the other CPU is added.
    let nic = n.nic_named("mlx5_0").unwrap();
    assert_eq!(nic.up, ["0000:10:00.0"]);
    assert_eq!(n.pci_path(g, nic), PciPath::Pix);
    assert_eq!(n.cpus.len(), 2);
    assert_eq!(n.gpus().len(), 2);
    // Fusing twice adds nothing more.
    let once = file.clone();
    fuse(&mut file, &detected);
    assert_eq!(file, once);
}

/// NCCL_TOPO_FILE as a communicator loads it: the file fused over what
/// this machine's detection finds (here no GPU, perhaps no NVML), and
/// what NCCL_TOPO_DUMP_FILE would write reads back alike.
#[test]
fn a_named_file_is_loaded_and_a_missing_one_refused() {
    let dir = std::env::temp_dir().join(format!("oxccl-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dgx.xml");
    std::fs::write(&path, DGX).unwrap();
    let l = load(Some(path.to_str().unwrap())).unwrap();
    assert!(l.from_file && l.source.contains("dgx.xml"), "{}", l.source);
    assert_eq!(l.node.gpus().len(), 8);
    assert!(l.node.nvlink_known);
    let back = Node::from_xml(&parse_file(&l.tree.write(), "dump").unwrap(), true);
    assert_eq!(back.gpus().len(), 8);
    assert_eq!(
        back.gpu_link(id(GPUS[0]), id(GPUS[3])),
        Some(Link::NvLink { links: 18 })
    );
    let e = load(Some("/nonexistent/topo.xml")).err().unwrap();
    assert!(e.to_string().contains("/nonexistent/topo.xml"), "{e}");
    // Unset: detection (or NCCL's default file, where this machine has one).
    let d = load(None).unwrap();
    assert!(parse_file(&d.tree.write(), "detected").is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
