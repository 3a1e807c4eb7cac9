//! The CPUs a GPU communicator's helper threads run on, as NCCL picks
//! them (NCCL_IGNORE_CPU_AFFINITY): the CPUs local to the GPU, from sysfs
//! (`/sys/bus/pci/devices/<bus id>/local_cpulist`), within the set the
//! process inherited; with NCCL_IGNORE_CPU_AFFINITY=1 the GPU's alone (the
//! kernel still keeps a thread within its cpuset). The choice is a pure
//! function of the two lists; reading and binding are thin around it.

use std::path::Path;

/// A kernel CPU list (`0-3,8,10-11`, a newline at the end): the CPUs in
/// order, or `None` where the text is not such a list.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The CPUs to bind to: those `gpu_local` and `inherited` share, or where
/// they share none, `None` (the inherited set stands, as NCCL leaves it);
/// with `ignore_inherited` (NCCL_IGNORE_CPU_AFFINITY=1) the GPU's alone.
/// `None` too where the GPU's list is empty (sysfs gave none).
pub fn thread_cpus(
    gpu_local: &[usize],
    inherited: &[usize],
    ignore_inherited: bool,
) -> Option<Vec<usize>> {
    if gpu_local.is_empty() {
        return None;
    }
    if ignore_inherited {
        return Some(gpu_local.to_vec());
    }
    let both: Vec<usize> = gpu_local
        .iter()
        .copied()
        .filter(|c| inherited.contains(c))
        .collect();
    (!both.is_empty()).then_some(both)
}

/// The GPU at `bus_id` (`0000:1B:00.0`, as the driver spells it): its
/// local CPUs under `sys` (`/sys` on a machine), `None` where sysfs has
/// no such list.
pub fn gpu_local_cpus(sys: &Path, bus_id: &str) -> Option<Vec<usize>> {
    let path = sys
        .join("bus/pci/devices")
        .join(bus_id.to_ascii_lowercase())
        .join("local_cpulist");
    parse_cpulist(&std::fs::read_to_string(path).ok()?)
}

/// The CPUs this thread may run on now.
pub fn inherited() -> Option<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    Some(
        (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
    )
}

/// The set helper threads of a communicator on the GPU at `bus_id` bind
/// to ([`thread_cpus`] from sysfs and this thread's affinity), `None`
/// where they keep what they inherit.
pub fn for_gpu(bus_id: &str, ignore_inherited: bool) -> Option<Vec<usize>> {
    let local = gpu_local_cpus(Path::new("/sys"), bus_id)?;
    thread_cpus(&local, &inherited().unwrap_or_default(), ignore_inherited)
}

/// Binds the calling thread to `cpus`.
pub fn bind_current(cpus: &[usize]) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("CPU {c}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("sched_setaffinity: {e}"))
}

/// A CPU list as the kernel writes one (`0-3,8`), for log lines.
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("\n"), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a-b"), None);
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    /// A two-socket host: the GPU hangs off socket 1 (CPUs 48-95 and
    /// 144-191); the launcher gave the process 0-7 and 48-55.
    #[test]
    fn helper_threads_take_the_gpus_cpus_within_the_inherited_set() {
        let gpu = parse_cpulist("48-95,144-191\n").unwrap();
        let inherited = parse_cpulist("0-7,48-55").unwrap();
        assert_eq!(
            thread_cpus(&gpu, &inherited, false),
            Some((48..=55).collect())
        );
        // NCCL_IGNORE_CPU_AFFINITY=1: the GPU's, whatever was inherited.
        assert_eq!(thread_cpus(&gpu, &inherited, true), Some(gpu.clone()));
        // Nothing in common: the inherited set stands.
        let elsewhere = parse_cpulist("0-7").unwrap();
        assert_eq!(thread_cpus(&gpu, &elsewhere, false), None);
        // sysfs had no list (a VM, no NUMA): nothing to bind to.
        assert_eq!(thread_cpus(&[], &inherited, true), None);
    }

    #[test]
    fn the_gpus_list_is_read_from_sysfs_by_bus_id() {
        let dir = std::env::temp_dir().join(format!("oxccl-affinity-{}", std::process::id()));
        let dev = dir.join("bus/pci/devices/0000:1b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("local_cpulist"), "0-3,8\n").unwrap();
        assert_eq!(
            gpu_local_cpus(&dir, "0000:1B:00.0"),
            Some(vec![0, 1, 2, 3, 8])
        );
        assert_eq!(gpu_local_cpus(&dir, "0000:2A:00.0"), None);
        std::fs::remove_dir_all(&dir).ok();
        // This thread's own set is known, and binding to it succeeds.
        let mine = inherited().unwrap();
        assert!(!mine.is_empty());
        bind_current(&mine).unwrap();
    }
}
