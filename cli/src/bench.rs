//! What one `oxccl perf` run is made of, shared by the host run
//! ([`crate::perf`]) and the device run (`perf_device`), which both build
//! on it: the flags ([`PerfArgs`]), the cases they select ([`Case`]), a
//! rank's figures summed over ranks ([`Stats`]) and nccl-tests' table
//! ([`report`]).

use oxccl::{Comm, DataType, RedOp};
use serde::Serialize;

use crate::check::{self, Coll};
use crate::hostmem::HostBuf;

/// `oxccl perf`'s flags: nccl-tests' short and long names first, in its
/// order, then oxccl's own; one line of help each, as nccl-tests' usage.
#[derive(Debug, Clone, clap::Args)]
// No long_about: clap would then print every flag's help on a line of its
// own under `--help`; the prose and examples are in the text after the flags.
#[command(after_help = PERF_AFTER_HELP)]
pub struct PerfArgs {
    /// GPUs driven by this one process, one rank each, device memory (implies --device cuda)
    #[arg(short = 'g', long = "ngpus", value_name = "N")]
    pub gpus: Option<usize>,
    /// Smallest size in bytes, with K, M, G suffixes
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "32M", value_parser = parse_bytes)]
    pub min_bytes: usize,
    /// Largest size in bytes
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "32M", value_parser = parse_bytes)]
    pub max_bytes: usize,
    /// Step between sizes in bytes, in place of -f
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = parse_bytes, conflicts_with = "step_factor")]
    pub step_bytes: Option<usize>,
    /// Multiplication factor between sizes
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "FACTOR",
        default_value_t = 2
    )]
    pub step_factor: usize,
    /// Timed iterations per size
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size
    #[arg(
        short = 'w',
        long = "warmup_iters",
        value_name = "N",
        default_value_t = 5
    )]
    pub warmup: usize,
    /// Check each result on fresh random data after the timed loop (1) or not (0)
    #[arg(short = 'c', long = "check", value_name = "0/1", default_value_t = 1)]
    pub check: u8,
    /// Reduction op: sum, prod, max, min, avg, premulsum, or all (nccl-tests' -o, --op)
    #[arg(short = 'o', long = "redop", value_name = "OP", default_value = "sum")]
    pub redop: String,
    /// Datatype (nccl-tests' names: float, half, bfloat16, double, int8, int32, f8e4m3, ...) or all
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "float"
    )]
    pub dtype: String,
    /// Root rank of broadcast and reduce
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub root: usize,
    /// Seconds a --ranks run may take before its ranks are stopped
    #[arg(
        short = 'T',
        long = "time-limit",
        visible_alias = "timeout",
        value_name = "SECONDS",
        default_value_t = 3600
    )]
    pub time_limit: u64,
    /// Collective: all_reduce, broadcast, reduce, all_gather, reduce_scatter, sendrecv, all_to_all, or all
    #[arg(
        long = "op",
        visible_aliases = ["coll", "collective"],
        value_name = "COLL",
        default_value = "all_reduce"
    )]
    pub coll: String,
    /// Start N local ranks as processes; without it, join a job of torchrun, mpirun or srun
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Memory of the buffers: host, or cuda (one GPU per rank, operations on a CUDA stream)
    #[arg(long, value_name = "MEM", default_value = "host", value_parser = ["host", "cuda"])]
    pub device: String,
    /// Also write every row as a JSON object to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Time the communicator's init only (host memory): the slowest rank's, and from the first rank's call to the last rank ready
    #[arg(long)]
    pub init_only: bool,
}

/// What it does, examples, and which of nccl-tests' flags are not here.
const PERF_AFTER_HELP: &str = "\
Times -n iterations of each size from -b to -e, after -w warm-up ones, and prints nccl-tests'
columns (time, algbw, busbw, #wrong), out of place and in place; with -c 1 it then checks
each result on fresh random data (#wrong: elements that differ, summed over ranks).

Examples:
  oxccl perf --ranks 2 -b 8 -e 128M -f 2             # all_reduce, 2 processes, host memory
  oxccl perf --ranks 64 --init-only                  # time to a ready communicator of 64 processes
  oxccl perf -g 2 -b 8 -e 1G -f 2 --op all           # every collective, 2 GPUs, one process
  oxccl perf --ranks 2 --device cuda -d all -o all   # every datatype and op, a GPU per process
  torchrun --nproc-per-node 8 --no-python oxccl perf -b 1M -e 1G   # in a torchrun job
  NCCL_COMM_ID=node0:29500 srun -n 16 oxccl perf -b 1M -e 1G       # in srun's (or mpirun's)

nccl-tests picks the collective by binary (all_reduce_perf, ...): here --op does, and the
reduction op is -o/--redop (nccl-tests' -o/--op). Times are the mean over ranks (nccl-tests'
-a 1). Not taken: -t, -m, -N, -p, -z, -y, -G, -C, -S, -a, -J (see --json), -R, -x, -D, -V,
-M, -u, -I, -K.";

fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (n, m) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    n.parse::<usize>()
        .map(|v| v * m)
        .map_err(|_| format!("{s:?} is not a size (e.g. 8, 64K, 16M, 1G)"))
}

#[derive(Debug, Serialize)]
struct Row {
    op: &'static str,
    bytes: usize,
    count: usize,
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    inplace: bool,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
}

fn list<T>(s: &str, all: &[T], parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String>
where
    T: Copy,
{
    if s == "all" {
        return Ok(all.to_vec());
    }
    s.split(',').map(|x| parse(x.trim())).collect()
}

/// The collectives, datatypes and ops the arguments ask for.
type Selection = (Vec<Coll>, Vec<DataType>, Vec<RedOp>);

pub(crate) fn selection(args: &PerfArgs, n: usize) -> Result<Selection, String> {
    let colls = list(&args.coll, &Coll::ALL, |s| {
        Coll::parse(s).ok_or_else(|| {
            let hint = if RedOp::parse(s).is_ok() {
                " (--op picks the collective here; the reduction op is -o/--redop, nccl-tests' -o/--op)"
            } else {
                ""
            };
            format!("unknown collective {s:?}{hint}")
        })
    })?;
    let dtypes = list(&args.dtype, &DataType::ALL, |s| {
        DataType::parse(s).map_err(|e| e.to_string())
    })?;
    let ops = list(&args.redop, &RedOp::ALL, |s| {
        RedOp::parse(s).map_err(|e| e.to_string())
    })?;
    if args.root >= n {
        return Err(format!("root {} is out of range for {n} ranks", args.root));
    }
    match args.step_bytes {
        Some(0) if args.min_bytes != args.max_bytes => {
            return Err("-i must be at least 1 byte".into())
        }
        None if args.step_factor < 2 && args.min_bytes != args.max_bytes => {
            return Err("-f must be at least 2 (or step by bytes with -i)".into());
        }
        _ => {}
    }
    Ok((colls, dtypes, ops))
}

/// A variant's (mean time across ranks in us, #wrong over ranks), or
/// `None` where it does not exist.
pub(crate) type Measured = oxccl::Result<Option<(f64, u64)>>;

/// Runs every selected case through `measure` and prints nccl-tests'
/// table (on the lead rank); returns the total #wrong.
pub(crate) fn report(
    args: &PerfArgs,
    n: usize,
    lead: bool,
    what: &str,
    measure: &mut dyn FnMut(Case) -> Measured,
) -> Result<u64, String> {
    let (colls, dtypes, ops) = selection(args, n)?;
    if lead {
        println!(
            "# oxccl perf: {what}, {} iterations, {} warm-up",
            args.iters, args.warmup
        );
        println!("#");
        println!(
            "# {:>10} {:>12} {:>8} {:>9} {:>6}   {:^34}   {:^34}",
            "", "", "", "", "", "out-of-place", "in-place"
        );
        println!(
            "# {:>10} {:>12} {:>8} {:>9} {:>6}  {:>9} {:>8} {:>8} {:>6}  {:>9} {:>8} {:>8} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "# {:>10} {:>12} {:>8} {:>9} {:>6}  {:>9} {:>8} {:>8} {:>6}  {:>9} {:>8} {:>8} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
    }
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    let mut busbw_sum = 0.0;
    let mut busbw_n = 0usize;
    for &coll in &colls {
        if lead && colls.len() > 1 {
            // nccl-tests runs one collective per binary; name each block here.
            println!("# {}", coll.name());
        }
        let coll_ops: Vec<RedOp> = if coll.reduces() {
            ops.clone()
        } else {
            vec![RedOp::Sum]
        };
        for &dtype in &dtypes {
            for &op in &coll_ops {
                let mut size = args.min_bytes;
                loop {
                    let mut line = String::new();
                    let (cin, cout) = coll.counts(size, dtype, n);
                    let root: i64 = if coll.has_root() {
                        args.root as i64
                    } else {
                        -1
                    };
                    let redop = if coll.reduces() { op.name() } else { "none" };
                    line += &format!(
                        "{:>12} {:>12} {:>8} {:>9} {:>6}",
                        size,
                        cin.max(cout),
                        dtype.name(),
                        redop,
                        root
                    );
                    for inplace in [false, true] {
                        let case = Case {
                            coll,
                            dtype,
                            op,
                            root: args.root,
                            size,
                            inplace,
                        };
                        let r = measure(case).map_err(|e| e.to_string())?;
                        match r {
                            Some((time_us, wrong)) => {
                                let algbw = size as f64 / time_us / 1e3;
                                let busbw = algbw * coll.bus_factor(n);
                                line += &format!(
                                    "  {time_us:>9.2} {algbw:>8.2} {busbw:>8.2} {wrong:>6}"
                                );
                                total_wrong += wrong;
                                busbw_sum += busbw;
                                busbw_n += 1;
                                rows.push(Row {
                                    op: coll.name(),
                                    bytes: size,
                                    count: cin.max(cout),
                                    dtype: dtype.name(),
                                    redop,
                                    root,
                                    inplace,
                                    time_us,
                                    algbw,
                                    busbw,
                                    wrong,
                                });
                            }
                            None => {
                                line += &format!(
                                    "  {:>9} {:>8} {:>8} {:>6}",
                                    "N/A", "N/A", "N/A", "N/A"
                                )
                            }
                        }
                    }
                    if lead {
                        println!("{line}");
                    }
                    if size >= args.max_bytes {
                        break;
                    }
                    size = next_size(args, size);
                }
            }
        }
    }
    if lead {
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            if busbw_n > 0 {
                busbw_sum / busbw_n as f64
            } else {
                0.0
            }
        );
        if let Some(path) = &args.json {
            let text = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
            std::fs::write(path, text + "\n")
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(total_wrong)
}

/// The size after `size`: plus -i bytes where given, else times -f; at most -e.
fn next_size(args: &PerfArgs, size: usize) -> usize {
    match args.step_bytes {
        Some(step) => size + step.max(1),
        None => size * args.step_factor.max(2),
    }
    .min(args.max_bytes)
}

/// One benchmark or test case: a collective on one size, type and op.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub coll: Coll,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    /// nccl-tests' size: bytes of the larger buffer of a rank.
    pub size: usize,
    pub inplace: bool,
}

impl Case {
    /// Whether the variant exists (send/recv and all-to-all have no in-place form).
    pub fn exists(&self) -> bool {
        !(self.inplace && matches!(self.coll, Coll::SendRecv | Coll::AllToAll))
    }

    /// (input elements, output elements, NCCL's count) per rank.
    pub fn counts(&self, n: usize) -> (usize, usize, usize) {
        let (cin, cout) = self.coll.counts(self.size, self.dtype, n);
        let count = match self.coll {
            Coll::AllGather => cin,
            Coll::ReduceScatter => cout,
            Coll::AllToAll => cin / n,
            _ => cin,
        };
        (cin, cout, count)
    }

    fn seed(&self) -> u64 {
        0x0c0c_u64
            ^ ((self.coll as u64) << 8)
            ^ ((self.dtype as u64) << 16)
            ^ ((self.size as u64) << 24)
    }

    /// Buffers for the case (for in-place, `output` is the single buffer),
    /// on huge pages unless `OXCCL_PERF_HUGEPAGES=0` (see [`HostBuf`]).
    pub fn buffers(&self, n: usize) -> (HostBuf, HostBuf) {
        let (cin, cout, _) = self.counts(n);
        let es = self.dtype.size();
        // Checked with every setting when the communicator was made (and
        // by run_rank): an error cannot come here.
        let huge = crate::hostmem::wanted().unwrap_or(true);
        (
            HostBuf::zeroed(cin * es, huge),
            HostBuf::zeroed(cout.max(if self.inplace { cin } else { 0 }) * es, huge),
        )
    }

    /// Poisons the output and writes this rank's input where the variant reads it.
    pub fn prepare(&self, rank: usize, n: usize, input: &mut [u8], output: &mut [u8]) {
        let (_, _, count) = self.counts(n);
        let (seed, es) = (self.seed(), self.dtype.size());
        check::poison(output);
        match (self.coll, self.inplace) {
            (Coll::AllGather, true) => {
                let b = count * es;
                check::fill(
                    &mut output[rank * b..(rank + 1) * b],
                    seed,
                    rank,
                    0,
                    self.dtype,
                    self.op,
                );
            }
            (_, true) => check::fill(output, seed, rank, 0, self.dtype, self.op),
            _ => check::fill(input, seed, rank, 0, self.dtype, self.op),
        }
    }

    /// Runs the collective once.
    pub fn run(&self, comm: &Comm, input: &[u8], output: &mut [u8]) -> oxccl::Result<()> {
        let (rank, n, root) = (comm.user_rank(), comm.count(), self.root);
        let (dtype, op) = (self.dtype, self.op);
        match (self.coll, self.inplace) {
            (Coll::AllReduce, false) => comm.all_reduce(Some(input), output, dtype, op),
            (Coll::AllReduce, true) => comm.all_reduce(None, output, dtype, op),
            (Coll::Broadcast, false) => comm.broadcast(Some(input), output, dtype, root),
            (Coll::Broadcast, true) => comm.broadcast(None, output, dtype, root),
            (Coll::Reduce, false) => comm.reduce(Some(input), output, dtype, op, root),
            (Coll::Reduce, true) => comm.reduce(None, output, dtype, op, root),
            (Coll::AllGather, false) => comm.all_gather(Some(input), output, dtype),
            (Coll::AllGather, true) => comm.all_gather(None, output, dtype),
            (Coll::ReduceScatter, false) => comm.reduce_scatter(input, output, dtype, op),
            (Coll::ReduceScatter, true) => comm.reduce_scatter_in_place(output, dtype, op),
            (Coll::SendRecv, _) => {
                let mut g = oxccl::Group::new();
                g.send(comm, input, dtype, (rank + 1) % n)?;
                g.recv(comm, output, dtype, (rank + n - 1) % n)?;
                g.run()
            }
            (Coll::AllToAll, _) => oxccl::all_to_all(comm, input, output, dtype),
        }
    }

    /// Elements of this rank's result that are wrong.
    pub fn wrong(&self, rank: usize, n: usize, output: &[u8]) -> u64 {
        let (_, _, count) = self.counts(n);
        let es = self.dtype.size();
        let out = match (self.coll, self.inplace) {
            (Coll::ReduceScatter, true) => &output[rank * count * es..(rank + 1) * count * es],
            _ => output,
        };
        check::check(
            self.coll,
            out,
            self.seed(),
            rank,
            n,
            count,
            self.dtype,
            self.op,
            self.root,
        )
    }

    /// Elements of a host rank's receive buffer that a collective which
    /// must not write it changed: a reduce's non-root buffer stays as
    /// prepared (its input in place, else the poison). Host memory only:
    /// nothing promises it of device scratch.
    pub fn stray(&self, rank: usize, n: usize, output: &[u8]) -> u64 {
        if self.coll != Coll::Reduce || rank == self.root {
            return 0;
        }
        let (_, _, count) = self.counts(n);
        let (dtype, op, seed) = (self.dtype, self.op, self.seed());
        let out = &output[..count * dtype.size()];
        if self.inplace {
            check::count_wrong(out, dtype, 0, |i| {
                (check::value(seed, rank, i, dtype, op), 0.0)
            })
        } else {
            out.chunks(dtype.size())
                .filter(|e| e.iter().any(|&b| b != 0xff))
                .count() as u64
        }
    }

    /// Prepares, runs once and checks: this rank's #wrong.
    pub fn check_once(&self, comm: &Comm) -> oxccl::Result<u64> {
        let (mut input, mut output) = self.buffers(comm.count());
        self.check_in(comm, &mut input, &mut output)
    }

    /// As [`Case::check_once`], in the caller's buffers (sized as
    /// [`Case::buffers`] makes them), so that a test can reuse memory a
    /// peer once knew the address of.
    pub fn check_in(&self, comm: &Comm, input: &mut [u8], output: &mut [u8]) -> oxccl::Result<u64> {
        let (rank, n) = (comm.user_rank(), comm.count());
        self.prepare(rank, n, input, output);
        self.run(comm, input, output)?;
        Ok(self.wrong(rank, n, output) + self.stray(rank, n, output))
    }
}

/// A rank's (time, #wrong) as two float64s, summed over ranks by an
/// all-reduce of whatever memory the ranks use.
pub(crate) struct Stats(pub [u8; 16]);

impl Stats {
    pub fn pack(time_us: f64, wrong: u64) -> Stats {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&time_us.to_ne_bytes());
        b[8..].copy_from_slice(&(wrong as f64).to_ne_bytes());
        Stats(b)
    }

    /// After the sum over `n` ranks: mean time, total #wrong.
    pub fn mean_and_total(&self, n: usize) -> (f64, u64) {
        let f =
            |r: std::ops::Range<usize>| f64::from_ne_bytes(self.0[r].try_into().expect("8 bytes"));
        (f(0..8) / n as f64, f(8..16) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command, FromArgMatches};

    fn command() -> Command {
        PerfArgs::augment_args(Command::new("perf"))
    }

    fn parse(args: &[&str]) -> Result<PerfArgs, clap::Error> {
        let m =
            command().try_get_matches_from(std::iter::once("perf").chain(args.iter().copied()))?;
        PerfArgs::from_arg_matches(&m)
    }

    #[test]
    fn takes_nccl_tests_short_and_long_names() {
        // nccl-tests' src/common.cu usage text, for the flags perf takes.
        let names = [
            ('g', "ngpus"),
            ('b', "minbytes"),
            ('e', "maxbytes"),
            ('i', "stepbytes"),
            ('f', "stepfactor"),
            ('n', "iters"),
            ('w', "warmup_iters"),
            ('c', "check"),
            ('d', "datatype"),
            ('r', "root"),
            ('T', "timeout"),
        ];
        let cmd = command();
        for (short, long) in names {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_short() == Some(short))
                .unwrap_or_else(|| panic!("no -{short}"));
            let longs: Vec<&str> = arg
                .get_long()
                .into_iter()
                .chain(arg.get_all_aliases().unwrap_or_default())
                .collect();
            assert!(longs.contains(&long), "-{short} is not --{long}: {longs:?}");
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                !help.is_empty() && !help.contains('\n'),
                "-{short}: {help:?}"
            );
        }
        let a = parse(&[
            "-b", "8", "-e", "1M", "-f", "4", "-n", "3", "-w", "1", "-T", "9",
        ])
        .unwrap();
        assert_eq!((a.min_bytes, a.max_bytes, a.step_factor), (8, 1 << 20, 4));
        assert_eq!((a.iters, a.warmup, a.time_limit), (3, 1, 9));
    }

    #[test]
    fn sizes_step_by_bytes_or_factor() {
        let sizes = |a: &PerfArgs| {
            let mut v = vec![a.min_bytes];
            while *v.last().unwrap() < a.max_bytes {
                v.push(next_size(a, *v.last().unwrap()));
            }
            v
        };
        let a = parse(&["-b", "8", "-e", "64", "-i", "24"]).unwrap();
        assert_eq!(sizes(&a), [8, 32, 56, 64]);
        let a = parse(&["-b", "1K", "-e", "5K", "-f", "4"]).unwrap();
        assert_eq!(sizes(&a), [1024, 4096, 5120]);
        assert!(
            parse(&["-i", "8", "-f", "4"]).is_err(),
            "-i and -f together"
        );
    }
}
