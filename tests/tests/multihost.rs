//! Two hosts as network namespaces joined by a veth pair, each with its
//! own address: ranks find each other through NCCL_COMM_ID, run
//! collectives, and fail within NCCL_TIMEOUT when the link is cut; with
//! four ranks, the three on the near side shrink the far one away and go on.
//! Skips, saying so, where namespaces cannot be made (not root, no `ip`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oxccl::{DataType, RedOp, ShrinkMode};
use oxccl_cli::launch::{id_to_hex, ENV_ID, ENV_NRANKS, ENV_RANK};
use oxccl_tests::checked_all_reduce;

const CHILD: &str = "OXCCL_NETNS_CHILD";

/// Two namespaces and the link between them, removed on drop.
struct Hosts {
    ns: [String; 2],
    addr: [String; 2],
    veth: [String; 2],
}

/// Runs `c` (with `input` on its stdin); Err with its stderr on failure.
fn run(mut c: Command, input: Option<&str>) -> Result<(), String> {
    use std::io::Write;
    let what = format!("{c:?}");
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("{what}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new(tag: &str) -> Result<Hosts, String> {
        let id = std::process::id() % 10000;
        let ns = [format!("ox{tag}{id}a"), format!("ox{tag}{id}b")];
        // A subnet per test, so that tests running at once do not meet.
        let (octet, net) = match tag {
            "k" => (233, 81 + id % 80),
            "l" => (233, 161 + id % 80),
            "d" => (235, 1 + id % 120),
            "a" => (235, 121 + id % 120),
            "n" => (236, 1 + id % 120),
            _ => (233, 1 + id % 80),
        };
        let addr = [format!("10.{octet}.{net}.1"), format!("10.{octet}.{net}.2")];
        let veth = [format!("oxv{tag}{id}a"), format!("oxv{tag}{id}b")];
        let h = Hosts { ns, addr, veth };
        for n in &h.ns {
            ip(&["netns", "add", n])?;
        }
        let [va, vb] = &h.veth;
        ip(&["link", "add", va, "type", "veth", "peer", "name", vb])?;
        for (i, v) in [va, vb].into_iter().enumerate() {
            ip(&["link", "set", v, "netns", &h.ns[i]])?;
            ip(&[
                "-n",
                &h.ns[i],
                "addr",
                "add",
                &format!("{}/24", h.addr[i]),
                "dev",
                v,
            ])?;
            ip(&["-n", &h.ns[i], "link", "set", v, "up"])?;
            ip(&["-n", &h.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    /// Drops `percent` % of the packets each way: tc netem where the kernel
    /// has it, else an nftables rule dropping packets at random as they
    /// come in (numgen random); which of the two, or Err where neither is
    /// there.
    fn lose(&self, percent: u32) -> Result<&'static str, String> {
        let netem = self.each(|ns, veth| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tc", "qdisc", "add", "dev", veth])
                .args(["root", "netem", "loss", &format!("{percent}%")]);
            run(c, None)
        });
        netem.map(|()| "tc netem").or_else(|e| {
            let rules = format!(
                "table inet oxloss {{\n chain in {{\n  type filter hook input priority 0;\n  \
                 numgen random mod 100 < {percent} counter drop\n }}\n}}\n"
            );
            self.each(|ns, _| {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "nft", "-f", "-"]);
                run(c, Some(&rules))
            })
            .map(|()| "nftables")
            .map_err(|f| format!("{e}; {f}"))
        })
    }

    /// Packets the nftables rule dropped in each namespace, as nft lists
    /// them ("packets N bytes M"); empty under netem.
    fn dropped(&self) -> Vec<String> {
        self.ns
            .iter()
            .filter_map(|ns| {
                let out = Command::new("ip")
                    .args([
                        "netns", "exec", ns, "nft", "list", "chain", "inet", "oxloss", "in",
                    ])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let at = text.find("packets")?;
                Some(text[at..].split(" drop").next()?.trim().to_string())
            })
            .collect()
    }

    fn each(&self, f: impl Fn(&str, &str) -> Result<(), String>) -> Result<(), String> {
        (0..2).try_for_each(|i| f(&self.ns[i], &self.veth[i]))
    }

    /// Takes host b's end of the link down.
    fn cut(&self) -> Result<(), String> {
        ip(&["-n", &self.ns[1], "link", "set", &self.veth[1], "down"])
    }

    fn start(&self, test: &str, env: &[(String, String)]) -> Vec<Child> {
        self.start_on(test, env, &[0, 1])
    }

    /// Starts rank r of `host.len()` in namespace `host[r]`, each rank a
    /// node of its own.
    fn start_on(&self, test: &str, env: &[(String, String)], host: &[usize]) -> Vec<Child> {
        self.launch(test, env, host, false)
    }

    /// Starts rank r in namespace `host[r]`, the ranks of a namespace one
    /// node (one NCCL_HOSTID).
    fn start_nodes(&self, test: &str, env: &[(String, String)], host: &[usize]) -> Vec<Child> {
        self.launch(test, env, host, true)
    }

    fn launch(
        &self,
        test: &str,
        env: &[(String, String)],
        host: &[usize],
        node_per_ns: bool,
    ) -> Vec<Child> {
        let exe = std::env::current_exe().unwrap();
        (0..host.len())
            .map(|r| {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &self.ns[host[r]]])
                    .arg(&exe)
                    .args([test, "--exact", "--nocapture", "--test-threads=1"]);
                c.env(CHILD, test)
                    .env(ENV_RANK, r.to_string())
                    .env(ENV_NRANKS, host.len().to_string());
                c.env("NCCL_SOCKET_IFNAME", "oxv");
                // Namespaces share the kernel, host name, boot id and
                // /dev/shm: a rank stands for a node only with its own
                // NCCL_HOSTID (else ranks would talk through shared
                // memory, past the link).
                let id = if node_per_ns {
                    self.ns[host[r]].clone()
                } else {
                    format!("{}-{r}", self.ns[host[r]])
                };
                c.env("NCCL_HOSTID", id);
                for (k, v) in env {
                    c.env(k, v);
                }
                c.stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // A link left in this namespace by a half-made setup goes too.
        let _ = ip(&["link", "del", &self.veth[0]]);
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// Waits for the children, killing them at the limit; returns (ok, output).
fn wait(children: Vec<Child>, limit: Duration) -> Vec<(bool, String)> {
    let start = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        })
        .collect()
}

fn setup(tag: &str, test: &str) -> Option<(Hosts, Vec<(String, String)>)> {
    let hosts = match Hosts::new(tag) {
        Ok(h) => h,
        Err(e) => {
            println!("skipped: cannot make network namespaces here ({e})");
            return None;
        }
    };
    let comm_id = format!(
        "{}:{}",
        hosts.addr[0],
        29500
            + std::process::id() % 1000
            + match tag {
                "k" => 1000,
                "l" => 2000,
                "d" => 3000,
                "a" => 4000,
                "n" => 5000,
                _ => 0,
            }
    );
    let cfg = oxccl::config::Config::load_with(&[("COMM_ID", &comm_id)]).unwrap();
    let id = oxccl::bootstrap::get_unique_id(&cfg).unwrap();
    let env = vec![
        ("NCCL_COMM_ID".to_string(), comm_id),
        (ENV_ID.to_string(), id_to_hex(&id)),
        ("NCCL_TIMEOUT".to_string(), "4".to_string()),
    ];
    let _ = test;
    Some((hosts, env))
}

fn child_comm() -> Option<oxccl::Comm> {
    if std::env::var(CHILD).is_err() {
        return None;
    }
    let env = oxccl_cli::launch::from_env().unwrap().unwrap();
    let cfg = oxccl::CommConfig::default();
    Some(oxccl::Comm::init_rank(env.nranks, env.id, env.rank, &cfg).unwrap())
}

/// Every collective at each of `sizes` on random data, checked against
/// the host's reference; prints "done" at the end.
fn check_every_collective(comm: &oxccl::Comm, root: usize, sizes: &[usize]) {
    oxccl_tests::check_every_collective(comm, root, sizes);
    println!("rank {} done", comm.user_rank());
}

#[test]
fn two_hosts_run_collectives() {
    let name = "two_hosts_run_collectives";
    if let Some(comm) = child_comm() {
        check_every_collective(&comm, 1, &[8, 3 << 20]);
        return;
    }
    let Some((hosts, env)) = setup("c", name) else {
        return;
    };
    let res = wait(hosts.start(name, &env), Duration::from_secs(60));
    for (r, (ok, out)) in res.iter().enumerate() {
        assert!(ok, "rank {r}:\n{out}");
    }
}

/// Two nodes of two ranks: inside a node ranks talk through shared
/// memory, between nodes through the net plugin, and the INFO log says so
/// for every connection, as NCCL's does (`Channel 00/0 : 0[-1] -> 1[-1]
/// via SHM/...`); every collective is exact.
#[test]
fn two_nodes_of_two_ranks_run_collectives() {
    let name = "two_nodes_of_two_ranks_run_collectives";
    if std::env::var(CHILD).is_ok() {
        oxccl::log::init();
    }
    if let Some(comm) = child_comm() {
        check_every_collective(&comm, 3, &[8, 3 << 20]);
        return;
    }
    let Some((hosts, mut env)) = setup("n", name) else {
        return;
    };
    env.push(("NCCL_DEBUG".into(), "INFO".into()));
    let node = [0, 0, 1, 1];
    let res = wait(
        hosts.start_nodes(name, &env, &node),
        Duration::from_secs(90),
    );
    for (r, (ok, out)) in res.iter().enumerate() {
        assert!(ok, "rank {r}:\n{out}");
        let (mut shm, mut net) = (0, 0);
        for line in out
            .lines()
            .filter(|l| l.contains(" -> ") && l.contains(" via "))
        {
            let (a, b, via) = connection(line).unwrap_or_else(|| panic!("rank {r}: {line}"));
            let inside = node[a] == node[b];
            if via.starts_with("SHM/") {
                assert!(inside, "rank {r}: shared memory between nodes: {line}");
                shm += 1;
            } else {
                assert!(via.starts_with("NET/"), "rank {r}: {line}");
                assert!(!inside, "rank {r}: the net inside a node: {line}");
                net += 1;
            }
        }
        assert!(
            shm > 0 && net > 0,
            "rank {r}: {shm} SHM and {net} NET connections:\n{out}"
        );
        eprintln!("rank {r}: {shm} connections through shared memory, {net} through the net");
    }
}

/// (from, to, transport) of an INFO line `Channel CC[/N] : A[d] -> B[d]
/// [send] via T`.
fn connection(line: &str) -> Option<(usize, usize, &str)> {
    let (_, rest) = line.split_once(" : ")?;
    let (a, rest) = rest.split_once(" -> ")?;
    let (b, rest) = rest.split_once('[')?;
    let (_, via) = rest.split_once(" via ")?;
    let rank = |s: &str| s.split('[').next()?.trim().parse().ok();
    Some((rank(a)?, rank(b)?, via.trim()))
}

/// The link goes down while both hosts are inside a stream of 16 MiB
/// all-reduces: every rank fails within NCCL_TIMEOUT (4 s here) plus the
/// time to notice, with an error that names the peer it lost and the
/// operation's number.
#[test]
fn cut_link_fails_both_hosts_in_bounded_time() {
    let name = "cut_link_fails_both_hosts_in_bounded_time";
    if let Some(comm) = child_comm() {
        let mut b = vec![0u8; 16 << 20];
        comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap();
        mark_ready(comm.user_rank());
        // The parent cuts the link during one of these.
        let deadline = Instant::now() + Duration::from_secs(40);
        let (e, last) = loop {
            let last = Instant::now();
            match comm.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum) {
                Ok(()) if Instant::now() < deadline => continue,
                Ok(()) => panic!("the link was never cut"),
                Err(e) => break (e, last),
            }
        };
        println!("failed after {:?}: {e}", last.elapsed());
        assert!(last.elapsed() < Duration::from_secs(20));
        let peer = 1 - comm.user_rank();
        let text = e.to_string();
        assert!(
            text.contains(&format!("rank {peer}")) && text.contains('#'),
            "the error names neither the peer (rank {peer}) nor the operation: {text}"
        );
        return;
    }
    let Some((hosts, mut env)) = setup("k", name) else {
        return;
    };
    let mark = mark_path("cut", &mut env);
    let children = hosts.start(name, &env);
    cut_when_ready(&hosts, &mark, 2);
    let res = wait(children, Duration::from_secs(60));
    for (r, (ok, out)) in res.iter().enumerate() {
        assert!(*ok && out.contains("failed after"), "rank {r}:\n{out}");
        println!(
            "rank {r}: {}",
            out.lines()
                .find(|l| l.contains("failed after"))
                .unwrap_or("")
        );
    }
}

/// Where ranks say they are inside their stream of operations (a file
/// `<path>.<rank>` each), handed to them in `env`.
fn mark_path(what: &str, env: &mut Vec<(String, String)>) -> std::path::PathBuf {
    let mark = std::env::temp_dir().join(format!("oxccl-{what}-{}", std::process::id()));
    env.push(("OXCCL_TEST_MARK".into(), mark.display().to_string()));
    mark
}

/// Writes this rank's mark (see [`mark_path`]).
fn mark_ready(rank: usize) {
    let mark = std::env::var("OXCCL_TEST_MARK").unwrap();
    std::fs::write(format!("{mark}.{rank}"), b"ready").unwrap();
}

/// Waits (30 s at most) for the marks of `n` ranks, then cuts the link
/// 300 ms later (inside the stream of operations, not between two) and
/// removes the marks.
fn cut_when_ready(hosts: &Hosts, mark: &std::path::Path, n: usize) {
    let ready = |r: usize| mark.with_extension(r.to_string()).exists();
    let start = Instant::now();
    while !(0..n).all(ready) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    hosts.cut().unwrap();
    for r in 0..n {
        let _ = std::fs::remove_file(mark.with_extension(r.to_string()));
    }
}

/// The rank alone on the far host, whose link is cut.
const FAR: usize = 1;

/// A rank's part in [`cut_link_survivors_shrink_and_go_on`]: checked
/// all-reduces until the link to rank FAR's host goes down; then the
/// survivors take the exclude list from the error, shrink in `mode`
/// (revoking first in the default mode) and run 100 checked all-reduces.
fn cut_then_shrink(comm: &oxccl::Comm, mode: ShrinkMode) {
    let r = comm.user_rank();
    let mut buf = vec![0u8; 64 << 10];
    assert_eq!(checked_all_reduce(comm, 0, &mut buf).unwrap(), 0);
    mark_ready(r);
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last_ok = Instant::now();
    let err = (1..)
        .find_map(|it| match checked_all_reduce(comm, it, &mut buf) {
            Ok(0) if Instant::now() < deadline => {
                last_ok = Instant::now();
                None
            }
            Ok(0) => panic!("rank {r}: the link was never cut"),
            Ok(w) => panic!("rank {r}: all_reduce #{it}: {w} wrong"),
            Err(e) => Some(e),
        })
        .unwrap();
    let detect = last_ok.elapsed();
    if r == FAR {
        println!("FAR RANK ERROR after {detect:?}: {err}");
        // Cut off: it leaves, as a lost node would.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::exit(0);
    }
    println!("rank {r}: failed after {detect:?}: {err}");
    assert!(detect < Duration::from_secs(4 + 5), "rank {r}: {detect:?}");
    let failure = comm.failure().expect("a failure record");
    println!("EXCLUDE {}", failure.tag());
    let t = Instant::now();
    if mode == ShrinkMode::Default {
        comm.revoke().unwrap();
    }
    let kid = comm
        .shrink(&failure.ranks, &oxccl::CommConfig::default(), mode)
        .unwrap_or_else(|e| panic!("rank {r}: shrink: {e}"));
    let shrink = t.elapsed();
    assert_eq!(
        (kid.count(), kid.user_rank()),
        (3, r - usize::from(r > FAR))
    );
    for i in 0..100 {
        let w = checked_all_reduce(&kid, 1000 + i, &mut buf)
            .unwrap_or_else(|e| panic!("rank {r}: all_reduce #{i} after shrink: {e}"));
        assert_eq!(w, 0, "rank {r}: all_reduce #{i} after shrink");
    }
    kid.destroy().unwrap();
    comm.destroy().unwrap();
    println!("PASS rank {r}: detected in {detect:?}, {mode:?} shrink in {shrink:?}");
}

/// Four ranks, each its own "host" (NCCL_HOSTID), ranks 0, 2 and 3 in one
/// namespace and rank 1 alone in the other: the link between the two goes
/// down inside a stream of all-reduces. The three survivors fail within
/// NCCL_TIMEOUT (4 s) plus a progress query, all with the same failure
/// record naming rank 1, shrink it away (revoke + NCCL_SHRINK_DEFAULT,
/// then NCCL_SHRINK_ABORT alone, each on fresh namespaces) and run 100
/// more all-reduces, checked.
#[test]
fn cut_link_survivors_shrink_and_go_on() {
    let name = "cut_link_survivors_shrink_and_go_on";
    if let Some(comm) = child_comm() {
        let mode = match std::env::var("OXCCL_TEST_SHRINK").as_deref() {
            Ok("abort") => ShrinkMode::Abort,
            _ => ShrinkMode::Default,
        };
        cut_then_shrink(&comm, mode);
        return;
    }
    for (tag, mode) in [("d", "default"), ("a", "abort")] {
        let Some((hosts, mut env)) = setup(tag, name) else {
            return;
        };
        env.push(("OXCCL_TEST_SHRINK".into(), mode.into()));
        let mark = mark_path(&format!("shrink-{mode}"), &mut env);
        let t = Instant::now();
        let children = hosts.start_on(name, &env, &[0, 1, 0, 0]);
        cut_when_ready(&hosts, &mark, 4);
        let res = wait(children, Duration::from_secs(60));
        println!("{mode} shrink: all ranks done in {:?}", t.elapsed());
        let survivors: Vec<(usize, &str)> = res
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != FAR)
            .map(|(r, (ok, out))| {
                assert!(*ok && out.contains("PASS"), "rank {r}:\n{out}");
                println!("{}", out.lines().find(|l| l.contains("PASS")).unwrap());
                (r, out.as_str())
            })
            .collect();
        oxccl_tests::assert_same_exclude_list(&survivors, &[FAR]);
        let far = &res[FAR].1;
        println!(
            "{}",
            far.lines().find(|l| l.contains("FAR RANK")).unwrap_or(far)
        );
    }
}

/// 1 % of packets lost each way: TCP retransmits, and every collective's
/// result is still exact. Skips, saying so, where the kernel has neither
/// netem nor nftables.
#[test]
fn lossy_link_gives_correct_results() {
    let name = "lossy_link_gives_correct_results";
    if let Some(comm) = child_comm() {
        check_every_collective(&comm, 0, &[8, 1 << 20, 16 << 20]);
        return;
    }
    let Some((hosts, env)) = setup("l", name) else {
        return;
    };
    match hosts.lose(1) {
        Ok(how) => println!("1 % loss each way by {how}"),
        Err(e) => {
            println!("skipped: cannot shape the link here ({e})");
            return;
        }
    }
    let t = Instant::now();
    let res = wait(hosts.start(name, &env), Duration::from_secs(120));
    println!(
        "both ranks done in {:?}; dropped: {:?}",
        t.elapsed(),
        hosts.dropped()
    );
    for (r, (ok, out)) in res.iter().enumerate() {
        assert!(*ok && out.contains("done"), "rank {r}:\n{out}");
    }
}
