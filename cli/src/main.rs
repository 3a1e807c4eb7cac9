use clap::{Parser, Subcommand};

/// oxccl: collective communication for GPUs, with NCCL's C API and plugins.
#[derive(Parser)]
#[command(
    name = "oxccl",
    version,
    long_about = "oxccl: collective communication for GPUs (all_reduce, broadcast, reduce, \
                  all_gather, reduce_scatter, send/recv, all_to_all), with NCCL's C API and plugin \
                  ABI. This command benchmarks and checks it as nccl-tests does, and shows its \
                  settings.\n\n\
                  Example: oxccl perf --ranks 2 -b 8 -e 128M -f 2",
    after_help = "\
Examples:
  oxccl perf --ranks 2 -b 8 -e 128M -f 2     # all_reduce, 2 processes, host memory
  oxccl perf -g 2 -b 8 -e 1G -f 2 --op all   # every collective, 2 GPUs, one process
  oxccl info                                 # every setting, its value and its source
  oxccl ras                                  # a running job's ranks and collectives in flight
  oxccl perf --help                          # the benchmark's flags (nccl-tests' names)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark and check collectives: nccl-tests' flags and columns.
    Perf(Box<oxccl_cli::perf::PerfArgs>),
    /// Time to recover from a lost rank (detect + shrink), on host memory.
    Recover(oxccl_cli::recover::RecoverArgs),
    /// Resolved settings, networks and interfaces.
    Info(oxccl_cli::info::InfoArgs),
    /// Ask a running job for its ranks, their state and the collectives in
    /// flight (NCCL's ncclras client; -h host, -p port, -t secs, -v, -f json).
    Ras(oxccl_cli::ras::RasArgs),
    /// Print a random key for NCCL_SOCKET_KEY_FILE: `oxccl keygen > key && chmod 600 key`.
    #[command(
        long_about = "Print a fresh random key for NCCL_SOCKET_KEY_FILE (64 hex digits). Give \
                      every rank the same file; bootstrap and socket traffic is then \
                      authenticated and encrypted.\n\n\
                      Example: oxccl keygen > key && chmod 600 key"
    )]
    Keygen,
}

fn main() {
    oxccl::log::init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Perf(a) => oxccl_cli::perf::main(*a),
        Cmd::Recover(a) => oxccl_cli::recover::main(a),
        Cmd::Info(a) => oxccl_cli::info::main(&a),
        Cmd::Ras(a) => oxccl_cli::ras::main(&a),
        Cmd::Keygen => oxccl_secure::Key::generate()
            .map(|k| {
                println!("{}", k.to_hex());
                0
            })
            .map_err(|e| format!("cannot read random bytes from /dev/urandom: {e}")),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("oxccl: {e}");
            std::process::exit(2);
        }
    }
}
