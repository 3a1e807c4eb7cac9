//! Mapping every rank's buffer into this process, for windows and their
//! signal words: the peers of this process address the buffer as it is;
//! the other processes of the host map it, through CUDA IPC for memory
//! from `cuMemAlloc`, or by importing its physical memory for memory from
//! the virtual memory API (`ncclMemAlloc`), whose POSIX file descriptor
//! passes over a Unix socket (SCM_RIGHTS). Ranks on other hosts cannot be
//! mapped; the caller refuses them before coming here.
#![allow(unsafe_code)] // sendmsg/recvmsg with SCM_RIGHTS, the C library's

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::Bootstrap;
use crate::cuda::vmm::{self, VmmImport};
use crate::cuda::{ipc, Context, Device, IpcMapping, IpcMemHandle};
use crate::error::{Error, Result};

/// How a buffer can be shared with another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Neither way: only ranks of this process can use it.
    None = 0,
    /// Memory from `cuMemAlloc`: a CUDA IPC handle of its allocation.
    Ipc = 1,
    /// Memory from `ncclMemAlloc` (the virtual memory API): a file
    /// descriptor of its physical memory, passed over a Unix socket.
    Vmm = 2,
}

/// What a rank tells the others about its buffer.
#[derive(Debug, Clone, Copy)]
struct Info {
    /// This process's random token: pids repeat across containers.
    process: u64,
    pid: u32,
    device: u32,
    kind: Kind,
    handle: [u8; 64],
    /// The buffer's offset in its allocation.
    offset: u64,
    /// The allocation's size (VMM: what the importer maps).
    alloc: u64,
    ptr: u64,
    size: u64,
    /// Names this rank's Unix socket (VMM).
    nonce: u64,
}

const INFO_BYTES: usize = 4 + 4 + 1 + 64 + 8 * 6;

impl Info {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(INFO_BYTES);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.device.to_le_bytes());
        b.push(self.kind as u8);
        b.extend_from_slice(&self.handle);
        for v in [
            self.offset,
            self.alloc,
            self.ptr,
            self.size,
            self.nonce,
            self.process,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8], rank: usize) -> Result<Info> {
        if b.len() != INFO_BYTES {
            return Err(Error::Internal(format!(
                "rank {rank}'s window description has {} bytes, not {INFO_BYTES}: ranks of different oxccl versions?",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let kind = match b[8] {
            1 => Kind::Ipc,
            2 => Kind::Vmm,
            _ => Kind::None,
        };
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[9..73]);
        Ok(Info {
            pid: u32_at(0),
            device: u32_at(4),
            kind,
            handle,
            offset: u64_at(73),
            alloc: u64_at(81),
            ptr: u64_at(89),
            size: u64_at(97),
            nonce: u64_at(105),
            process: u64_at(113),
        })
    }
}

/// A peer's buffer mapped here; unmapped when dropped.
#[derive(Debug)]
pub(super) enum Mapped {
    Ipc(#[allow(dead_code)] IpcMapping),
    Vmm(#[allow(dead_code)] VmmImport),
}

/// Every rank's buffer as this process addresses it.
#[derive(Debug)]
pub(super) struct Shared {
    /// By rank: the address here and the rank's size.
    pub addrs: Vec<u64>,
    pub sizes: Vec<usize>,
    pub maps: Vec<Mapped>,
}

/// A random number of this process, the same for all its calls.
fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(rand::random)
}

fn socket_name(pid: u32, nonce: u64) -> String {
    format!("oxccl-win-{pid}-{nonce:016x}")
}

/// Collective: every rank passes its buffer `ptr..ptr + size` (device
/// memory of `ctx`'s GPU) and gets every rank's, mapped where needed.
/// `what` names the buffer in errors. Every rank reaches the same verdict
/// from the same exchanged descriptions, so a refusal is every rank's.
pub(super) fn exchange(
    bootstrap: &Bootstrap,
    ctx: &Arc<Context>,
    ptr: u64,
    size: usize,
    what: &str,
    timeout: Duration,
) -> Result<Shared> {
    ctx.bind()?;
    let me = bootstrap.rank();
    let pid = std::process::id();
    let mut info = Info {
        process: process_token(),
        pid,
        device: ctx.device().ordinal() as u32,
        kind: Kind::None,
        handle: [0; 64],
        offset: 0,
        alloc: 0,
        ptr,
        size: size as u64,
        nonce: rand::random(),
    };
    if let Some((base, bytes)) = vmm::vmm_containing(ptr) {
        info.kind = Kind::Vmm;
        info.offset = ptr - base;
        info.alloc = bytes as u64;
    } else if let Some(e) = ipc::export(ctx, ptr)? {
        info.kind = Kind::Ipc;
        info.handle = e.handle.0;
        info.offset = e.offset;
    }
    // Listening before the exchange, so peers may connect as soon as they
    // know the name.
    let listener = if info.kind == Kind::Vmm {
        let addr = SocketAddr::from_abstract_name(socket_name(pid, info.nonce))
            .map_err(|e| Error::System(format!("{what}: a Unix socket name: {e}")))?;
        Some(
            UnixListener::bind_addr(&addr)
                .map_err(|e| Error::System(format!("{what}: binding a Unix socket: {e}")))?,
        )
    } else {
        None
    };
    let all = bootstrap.allgather(&info.encode())?;
    let infos: Vec<Info> = all
        .iter()
        .enumerate()
        .map(|(r, b)| Info::decode(b, r))
        .collect::<Result<_>>()?;
    // Every rank checks every rank's buffer alike.
    let unshareable: Vec<usize> = (0..infos.len())
        .filter(|&r| {
            infos[r].kind == Kind::None && infos.iter().any(|o| o.process != infos[r].process)
        })
        .collect();
    if !unshareable.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{what}: the buffer of rank(s) {unshareable:?} can be mapped by no other process: it is neither memory from ncclMemAlloc nor from cudaMalloc/cuMemAlloc (pageable or host memory, or a virtual-memory allocation oxccl did not make); allocate it with ncclMemAlloc"
        )));
    }
    let mut addrs = vec![0u64; infos.len()];
    let mut maps = Vec::new();
    // Peers whose memory comes by file descriptor: connect to each first
    // (the connection completes in the listener's backlog), serve ours,
    // then read theirs; nobody waits for anybody in between.
    let mut incoming = Vec::new();
    for (r, o) in infos.iter().enumerate() {
        if r == me {
            addrs[r] = ptr;
        } else if o.process == info.process {
            addrs[r] = o.ptr;
            if o.device as usize != info.device as usize {
                let peer = Context::primary(Device::get(o.device as usize)?)?;
                if let Err(e) = ctx.enable_peer_access(&peer) {
                    tracing::debug!(target: "oxccl::win", "{what}: peer access from GPU {} to GPU {}: {e}", info.device, o.device);
                }
                ctx.bind()?;
            }
        } else if o.kind == Kind::Ipc {
            let m = IpcMapping::open(ctx, &IpcMemHandle(o.handle))?;
            addrs[r] = m.ptr() + o.offset;
            maps.push(Mapped::Ipc(m));
        } else {
            let addr = SocketAddr::from_abstract_name(socket_name(o.pid, o.nonce))
                .map_err(|e| Error::System(format!("{what}: a Unix socket name: {e}")))?;
            let s = UnixStream::connect_addr(&addr).map_err(|e| {
                Error::System(format!(
                    "{what}: connecting to rank {r}'s Unix socket for its memory handle: {e}"
                ))
            })?;
            incoming.push((r, s));
        }
    }
    if let Some(l) = listener {
        let callers = infos.iter().filter(|o| o.process != info.process).count();
        if callers > 0 {
            let (fd, _, _) = vmm::vmm_export(ptr - info.offset)?;
            serve(&l, &fd, callers, timeout, what)?;
        }
    }
    for (r, s) in incoming {
        s.set_read_timeout(Some(timeout))
            .map_err(|e| Error::System(format!("{what}: {e}")))?;
        let fd = recv_fd(s.as_raw_fd()).map_err(|e| {
            Error::System(format!(
                "{what}: receiving rank {r}'s memory handle over its Unix socket: {e}"
            ))
        })?;
        let m = VmmImport::new(&fd, infos[r].alloc as usize, info.device as usize)?;
        addrs[r] = m.ptr() + infos[r].offset;
        maps.push(Mapped::Vmm(m));
    }
    ctx.bind()?;
    Ok(Shared {
        addrs,
        sizes: infos.iter().map(|o| o.size as usize).collect(),
        maps,
    })
}

/// Accepts `callers` connections and hands each the descriptor.
fn serve(
    l: &UnixListener,
    fd: &OwnedFd,
    callers: usize,
    timeout: Duration,
    what: &str,
) -> Result<()> {
    let io = |e: std::io::Error| Error::System(format!("{what}: serving our memory handle: {e}"));
    l.set_nonblocking(true).map_err(io)?;
    let start = Instant::now();
    let mut served = 0;
    while served < callers {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(io)?;
                send_fd(s.as_raw_fd(), fd.as_raw_fd()).map_err(io)?;
                served += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > timeout {
                    return Err(Error::System(format!(
                        "{what}: {served} of the {callers} ranks of other processes came for our memory handle within {timeout:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// Sends one byte with `fd` attached.
fn send_fd(sock: RawFd, fd: RawFd) -> std::io::Result<()> {
    let byte = [1u8];
    let iov = [IoSlice::new(&byte)];
    // SAFETY: CMSG_SPACE is a pure computation on a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` has a control buffer of CMSG_SPACE(one fd) bytes, so
    // the first header exists and its data holds one descriptor.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` points at live buffers (`iov`, `control`) for the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Receives the descriptor [`send_fd`] sent.
fn recv_fd(sock: RawFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = [IoSliceMut::new(&mut byte)];
    // SAFETY: as in `send_fd`.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers for the call; the received
    // descriptors are closed on exec.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the peer closed the socket without sending",
        ));
    }
    // SAFETY: the kernel filled the control buffer; CMSG_FIRSTHDR checks
    // its length and answers NULL where there is no header.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the peer's message carried no descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips() {
        let i = Info {
            process: 42,
            pid: 7,
            device: 3,
            kind: Kind::Vmm,
            handle: [9; 64],
            offset: 4096,
            alloc: 2 << 20,
            ptr: 0x7f00_0000_1000,
            size: 12345,
            nonce: 0xdead_beef,
        };
        let o = Info::decode(&i.encode(), 0).unwrap();
        assert_eq!(
            (o.pid, o.device, o.kind, o.handle, o.offset, o.alloc, o.ptr, o.size, o.nonce),
            (
                7,
                3,
                Kind::Vmm,
                [9; 64],
                4096,
                2 << 20,
                0x7f00_0000_1000,
                12345,
                0xdead_beef
            )
        );
        assert_eq!(o.process, 42);
        assert!(Info::decode(&[0; 3], 1).is_err());
    }

    #[test]
    fn a_descriptor_passes_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        send_fd(a.as_raw_fd(), f.as_raw_fd()).unwrap();
        let got = recv_fd(b.as_raw_fd()).unwrap();
        // The same open file: its /proc link names the same path.
        let link = std::fs::read_link(format!("/proc/self/fd/{}", got.as_raw_fd())).unwrap();
        assert!(link.to_string_lossy().ends_with("/stat"), "{link:?}");
    }
}
