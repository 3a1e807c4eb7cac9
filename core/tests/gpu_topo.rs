//! Topology detection on the machine at hand: where a GPU is found, every
//! GPU has a PCI address and a place in sysfs, and on a machine with
//! NVLink every pair with peer access reports at least one link. Where no
//! GPU is found the test says why it skipped.
//!
//! `OXCCL_EXPECT_NVLINK=18` (on two H200 joined by NV18) makes it check
//! the exact count between GPUs 0 and 1.

use std::path::Path;

use oxccl::cuda;
use oxccl::topo::{self, Link, Topology};

#[test]
fn topology_of_this_machine() {
    match cuda::device_count() {
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
        Ok(0) => {
            println!("skipped: the CUDA driver sees no GPU");
            return;
        }
        Ok(_) => {}
    }
    let t = Topology::detect();
    for g in &t.gpus {
        println!(
            "GPU {} {} {:?} cc {:?} pci {:?} nvlinks {:?}",
            g.facts.ordinal,
            g.facts.name,
            g.facts.bus_id.map(|b| b.to_string()),
            g.facts.compute_capability,
            g.pci.as_ref().map(|p| (&p.root, p.numa, p.link)),
            g.nvlinks
        );
    }
    for p in &t.pairs {
        println!("GPU {} - GPU {}: {} {:?}", p.a, p.b, p.link, p.p2p);
    }
    for n in &t.notes {
        println!("note: {n}");
    }
    assert!(
        !t.gpus.is_empty(),
        "the driver counts GPUs but none was described"
    );
    for g in &t.gpus {
        assert!(
            g.facts.bus_id.is_some(),
            "GPU {} has no PCI address",
            g.facts.ordinal
        );
        assert!(g.facts.compute_capability.0 >= 3, "{:?}", g.facts);
    }
    let sysfs = Path::new("/sys/bus/pci/devices").is_dir();
    if sysfs {
        for g in &t.gpus {
            assert!(
                g.pci.is_some(),
                "GPU {} not found in sysfs: {:?}",
                g.facts.ordinal,
                t.notes
            );
        }
    } else {
        println!("no /sys/bus/pci here: PCIe paths not checked");
    }
    let nvlink_machine = t.gpus.iter().any(|g| {
        g.nvlinks
            .as_ref()
            .is_some_and(|n| n.to_switch > 0 || !n.to_gpu.is_empty())
    });
    let n = t.gpus.len();
    assert_eq!(t.pairs.len(), n * (n - 1) / 2);
    for p in &t.pairs {
        let access = p.p2p.is_some_and(|x| x.access);
        if nvlink_machine && access {
            assert!(
                matches!(p.link, Link::NvLink { links } if links >= 1),
                "GPU {} - GPU {}: peer access on an NVLink machine but {}",
                p.a,
                p.b,
                p.link
            );
        }
        if sysfs {
            assert_ne!(p.link, Link::Unknown, "GPU {} - GPU {}", p.a, p.b);
        }
    }
    if let Ok(want) = std::env::var("OXCCL_EXPECT_NVLINK") {
        let want: u32 = want.parse().expect("OXCCL_EXPECT_NVLINK is a number");
        let p = t.pair(0, 1).expect("two GPUs");
        assert_eq!(p.link, Link::NvLink { links: want });
    }
    if n >= 2 {
        let ring: Vec<_> = t.gpus.iter().filter_map(|g| g.facts.bus_id).collect();
        let cc = t.gpus[0].facts.compute_capability;
        let found = topo::ring_channels(&ring, cc, Path::new("/sys"));
        println!("ring over every GPU: {found:?} (channels, slowest link)");
        if sysfs {
            let (ch, _) = found.expect("a link between the GPUs");
            assert!((1..=128).contains(&ch));
        }
    } else {
        println!("one GPU: no pair to check");
    }
}

/// Ranks of one process detect their topology on threads of their own at
/// once; every thread must see what one thread alone sees. (When each
/// opened and shut NVML itself, one thread's shutdown made another's link
/// queries fail, and an NVLink pair looked like PCIe.)
#[test]
fn threads_detecting_at_once_see_the_same_links() {
    let n = match cuda::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => return println!("skipped: the CUDA driver sees no GPU"),
        Err(e) => return println!("skipped: {e}"),
    };
    let buses: Vec<_> = (0..n)
        .filter_map(|i| {
            cuda::Device::get(i)
                .ok()?
                .pci_bus_id()
                .ok()?
                .parse::<topo::BusId>()
                .ok()
        })
        .collect();
    let alone = match topo::nvlink::detect(&buses) {
        Ok(l) => l,
        Err(e) => return println!("skipped: {e}"),
    };
    println!("{} GPU(s), alone: {alone:?}", buses.len());
    std::thread::scope(|s| {
        let seen: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..25)
                        .map(|_| topo::nvlink::detect(&buses))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (t, h) in seen.into_iter().enumerate() {
            for (i, got) in h.join().unwrap().into_iter().enumerate() {
                assert_eq!(got.as_ref(), Ok(&alone), "thread {t}, detection {i}");
            }
        }
    });
}
