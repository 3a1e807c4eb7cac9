use clap::{Parser, Subcommand};

/// oxccl: collective communication for GPUs, with NCCL-ABI plugins.
#[derive(Parser)]
#[command(name = "oxccl", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark and check collectives (nccl-tests' columns).
    Perf(Box<oxccl_cli::perf::PerfArgs>),
    /// Time to recover from a lost rank (detect + shrink), on host memory.
    Recover(oxccl_cli::recover::RecoverArgs),
    /// Resolved settings, networks and interfaces.
    Info(oxccl_cli::info::InfoArgs),
    /// Prints a fresh random key for NCCL_SOCKET_KEY_FILE (64 hex digits):
    /// `oxccl keygen > key && chmod 600 key`, then give every rank the file.
    Keygen,
}

fn main() {
    oxccl::log::init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Perf(a) => oxccl_cli::perf::main(*a),
        Cmd::Recover(a) => oxccl_cli::recover::main(a),
        Cmd::Info(a) => oxccl_cli::info::main(&a),
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
