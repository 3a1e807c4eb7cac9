//! Two hosts as network namespaces joined by a veth pair, each with its
//! own address: ranks find each other through NCCL_COMM_ID, run
//! collectives, and fail within NCCL_TIMEOUT when the link is cut.
//! Skips, saying so, where namespaces cannot be made (not root, no `ip`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oxccl::{DataType, RedOp};
use oxccl_cli::launch::{id_to_hex, ENV_ID, ENV_NRANKS, ENV_RANK};

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
        let net = 1
            + (id % 80)
            + match tag {
                "k" => 80,
                "l" => 160,
                _ => 0,
            };
        let addr = [format!("10.233.{net}.1"), format!("10.233.{net}.2")];
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
        let exe = std::env::current_exe().unwrap();
        (0..2)
            .map(|r| {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &self.ns[r]]).arg(&exe).args([
                    test,
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ]);
                c.env(CHILD, test)
                    .env(ENV_RANK, r.to_string())
                    .env(ENV_NRANKS, "2");
                c.env("NCCL_SOCKET_IFNAME", "oxv");
                // Namespaces share the kernel, host name, boot id and
                // /dev/shm: each stands for a node only with its own
                // NCCL_HOSTID (else the ranks would talk through shared
                // memory, past the link).
                c.env("NCCL_HOSTID", &self.ns[r]);
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
    Some(oxccl::Comm::init_rank(2, env.id, env.rank, &oxccl::CommConfig::default()).unwrap())
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
        let mark = std::env::var("OXCCL_TEST_MARK").unwrap();
        std::fs::write(format!("{mark}.{}", comm.user_rank()), b"ready").unwrap();
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
    let mark = std::env::temp_dir().join(format!("oxccl-cut-{}", std::process::id()));
    env.push(("OXCCL_TEST_MARK".into(), mark.display().to_string()));
    let children = hosts.start(name, &env);
    let ready = |r: usize| mark.with_extension(r.to_string()).exists();
    let start = Instant::now();
    while !(ready(0) && ready(1)) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Inside the stream of all-reduces, not between two.
    std::thread::sleep(Duration::from_millis(300));
    hosts.cut().unwrap();
    for r in 0..2 {
        let _ = std::fs::remove_file(mark.with_extension(r.to_string()));
    }
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
