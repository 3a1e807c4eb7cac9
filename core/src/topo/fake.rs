//! A sysfs tree in a temporary directory, for the tests of this module: the
//! shapes of `/sys/devices`, `/sys/bus/pci/devices`, `/sys/class/net` and
//! `/sys/class/infiniband` that the readers rely on, and nothing else.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct FakeSys {
    root: PathBuf,
}

impl FakeSys {
    pub fn new() -> FakeSys {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "oxccl-fakesys-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::fs::create_dir_all(root.join("class/net")).unwrap();
        FakeSys { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A chain of functions under host bridge `pci0000:00`, the device last.
    pub fn pci(&self, chain: &[&str], numa: i32) -> PathBuf {
        self.pci_in("pci0000:00", chain, numa)
    }

    /// As [`FakeSys::pci`] under another host bridge. Every function gets a
    /// Gen5 x16 link and the NUMA node, as the kernel fills them in.
    pub fn pci_in(&self, bridge: &str, chain: &[&str], numa: i32) -> PathBuf {
        let mut dir = self.root.join("devices").join(bridge);
        for f in chain {
            dir.push(f);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
            std::fs::write(dir.join("max_link_speed"), "32.0 GT/s PCIe\n").unwrap();
            std::fs::write(dir.join("max_link_width"), "16\n").unwrap();
            let link = self.root.join("bus/pci/devices").join(f);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(&dir, &link).unwrap();
            }
        }
        dir
    }

    /// Writes `text` at `rel` under the root, creating directories.
    pub fn set(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A network interface; `device` is the PCI function it belongs to, as
    /// the kernel links it, or None for a virtual one.
    pub fn net(&self, name: &str, device: Option<&str>, speed: &str) {
        let dir = self.root.join("class/net").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("speed"), format!("{speed}\n")).unwrap();
        if let Some(d) = device {
            let target = std::fs::canonicalize(self.root.join("bus/pci/devices").join(d)).unwrap();
            std::os::unix::fs::symlink(target, dir.join("device")).unwrap();
        }
    }

    /// An RDMA device with its ports: (number, state, rate).
    pub fn ib(&self, name: &str, device: &str, ports: &[(u32, &str, &str)]) {
        let dir = self.root.join("class/infiniband").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let target = std::fs::canonicalize(self.root.join("bus/pci/devices").join(device)).unwrap();
        std::os::unix::fs::symlink(target, dir.join("device")).unwrap();
        for (n, state, rate) in ports {
            let p = dir.join("ports").join(n.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("state"), format!("{state}\n")).unwrap();
            std::fs::write(p.join("rate"), format!("{rate}\n")).unwrap();
            std::fs::write(p.join("link_layer"), "InfiniBand\n").unwrap();
        }
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
