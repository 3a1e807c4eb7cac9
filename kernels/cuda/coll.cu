// Collectives between GPUs of one node: one kernel runs a schedule (the
// steps of core/src/algo, abstracted over the channel's range), each thread
// block being one channel with its own slice of the data and its own
// connections.
//
// A connection p -> r (per channel) is a FIFO of `nslots` slots in r's
// receive area: p stores a slice into the next slot with 16-byte stores,
// records its size, fences, and bumps `tail` there; r waits for `tail`,
// reads the slot from its own memory, and bumps `head` in p's area so p may
// reuse the slot. Each side polls only words in its own memory. The counters
// grow for the life of the communicator; the kernel keeps them in the
// window's state area between launches, so no host round trip is needed.
//
// Where the areas are is the transport's business (core/src/transport):
// a peer's GPU memory over NVLink (P2P), host memory shared between the
// processes of a host (SHM), or host memory a proxy thread moves through
// the net plugin (NET: the "peer's area" is then a local mirror the proxy
// sends from, and the proxy fills this rank's area as messages arrive).
// The kernel sees only addresses: `mine[p]` where it receives from p,
// `peer[p]` where it sends to p, both laid out alike; their slots are at
// `fifo_mine[p]` and `fifo_peer[p]`, in the same areas, or in device
// memory that the network reads and writes itself (GPUDirect), the counters
// staying in host memory for the proxy.
//
// A launch of few bytes goes through each connection's second FIFO, the
// LL one (NCCL's low-latency protocol), with counters of its own: every
// 16-byte line of a slot holds 8 bytes of data and, twice, a flag naming
// the step, stored in one access. The receiver polls its lines until both
// flags are the step's, so it reads the data as it lands, without a flag
// read first; the sender needs no fence, and records the slot's size only
// for a proxy, which sends the slot once every line carries the flag. The
// LL slots are always in the areas (host memory for the network).

#define OXCCL_MAX_RANKS 64
#define OXCCL_MAX_STEPS 64
#define OXCCL_FLAG_BYTES 64

#define OXCCL_BUF_NONE 0
#define OXCCL_BUF_INPUT 1
#define OXCCL_BUF_OUTPUT 2
#define OXCCL_WHOLE 0xff

#define OXCCL_STEP_SEND_LOCAL 1
#define OXCCL_STEP_FINALIZE 2
// Steps of one of the double binary tree's two trees: run by the even
// (resp. odd) channels only.
#define OXCCL_STEP_EVEN_CH 4
#define OXCCL_STEP_ODD_CH 8

#define OXCCL_PROTO_SIMPLE 0
#define OXCCL_PROTO_LL 1

// In a simple slot's size word: the slot holds, in its first 8 bytes, the
// address of the slice in the sender's registered buffer, which the
// receiver reads where it lies (see CollArgs::direct_in).
#define OXCCL_SIZE_DIRECT (1ull << 63)

// Layout and peers of a window; at offset 0 of every window. Mirrored by
// `WinHeader` in core/src/cuda/abi.rs.
struct WinHeader {
  u64 off_tail;   // in an area: u64 per (peer index, channel), OXCCL_FLAG_BYTES apart: slices a peer posted here
  u64 off_head;   // same shape: slices a peer consumed of ours
  u64 off_state;  // in the window: 8 u64 per (peer index, channel): OxChan::state, 4 for each FIFO
  u64 off_fifo;   // in an area: nslots slots per (peer index, channel)
  u64 off_size;   // in an area: a u64 per slot of the fifo: the bytes the sender stored there
  u64 slot_bytes;
  u32 nslots;
  u32 maxch;
  u32 rank;
  u32 nranks;
  u64 off_tail_ll;  // the LL FIFO's parts, as the simple one's
  u64 off_head_ll;
  u64 off_size_ll;
  u64 off_fifo_ll;  // in the area itself: peer[p] / mine[p] + off_fifo_ll
  u64 ll_slot_bytes;
  u64 peer[OXCCL_MAX_RANKS];  // the area each rank receives from this one in, as this process addresses it
  u64 mine[OXCCL_MAX_RANKS];  // the area this rank receives from each rank in
  u64 fifo_peer[OXCCL_MAX_RANKS];  // slot 0 of cell 0 of peer[p]'s slots: in the area, or device memory (GPUDirect)
  u64 fifo_mine[OXCCL_MAX_RANKS];  // the same for mine[p]
};

// One step (see core/src/algo/mod.rs); offsets are abstract: element e of
// the step's part of the channel's range lives at `block * count + e` of
// the buffer. Mirrored by `DevStep` in core/src/cuda/abi.rs.
struct DevStep {
  short recv;  // peer rank, or -1
  short send;
  u8 src_buf;  // OXCCL_BUF_*
  u8 dst_buf;
  u8 chunk;    // part of the channel's range (of nchunks), or OXCCL_WHOLE
  u8 flags;    // OXCCL_STEP_*
  u16 src_block;
  u16 dst_block;
  u32 pad;
};

struct CollArgs {
  u64 comm;  // this rank's window
  u64 input;
  u64 output;
  u64 count;  // elements per rank block; the range the channels share
  Scalars sc;
  u64 timeout_ns;  // a wait longer than this traps (a dead peer must not hang the GPU)
  u32 nsteps;
  u32 nchunks;
  u32 slice_elems;  // elements per FIFO slot use, a multiple of 16 bytes
  u32 nchannels;
  u32 group;  // slices a step moves before the next step moves (a chunk); 0 or 1: one
  u32 proto;  // OXCCL_PROTO_*: the FIFO every slice of the launch goes through
  // Where each block writes its globaltimer at start and end (two u64 per
  // channel, in mapped host memory), for the profiler's KernelCh events; 0:
  // not timed.
  u64 stamps;
  // A word in mapped host memory that the host sets to end the launch now
  // (a revoke, an abort, NCCL_SHRINK_ABORT): a wait that sees it non-zero
  // gives up and the blocks return without trapping, so the context stays
  // usable. 0: none.
  u64 abort;
  // Registered buffers (ncclCommRegister), a bit per peer rank: the peers
  // that read this rank's input (direct_in) or output (direct_out) where it
  // lies, at this process's addresses. A slice sent to such a peer from
  // there posts its address in the slot instead of its bytes; the sender
  // waits at its end until the peer has read every such slice, so the
  // buffer may change after the launch as after any other. direct_from:
  // the peers that may post so to this rank (whose slot size words are in
  // device memory); only their size words are read.
  u64 direct_in;
  u64 direct_out;
  u64 direct_from;
  DevStep steps[OXCCL_MAX_STEPS];
};

__device__ __forceinline__ u64 oxccl_ld_acquire_sys(const volatile u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void oxccl_st_relaxed_sys(volatile u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 oxccl_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Whether the host asked the launch to end (see CollArgs::abort).
__device__ __forceinline__ bool oxccl_aborted(u64 abort) {
  return abort != 0 && oxccl_ld_acquire_sys((const volatile u64*)abort) != 0;
}

// One spin of a wait: false once the host set the abort word. A peer that
// never comes would hang the GPU for good; past the timeout the kernel
// traps, which the host sees as an error. The abort word is read with the
// clock, every 1024 spins: a host read costs about a microsecond, and a
// revoke waits at most that much longer.
__device__ __forceinline__ bool oxccl_keep_waiting(u32& spins, u64& t0, u64 timeout_ns, u64 abort) {
  if (++spins < 1024) return true;
  spins = 0;
  if (oxccl_aborted(abort)) return false;
  const u64 now = oxccl_globaltimer();
  if (t0 == 0) t0 = now;
  else if (now - t0 > timeout_ns) __trap();
  return true;
}

// Spins until *p >= v (true; the value read in *seen where given), or
// until the host sets the abort word (false).
__device__ __forceinline__ bool oxccl_wait_geq(const volatile u64* p, u64 v, u64 timeout_ns, u64 abort,
                                               u64* seen = 0) {
  u32 spins = 0;
  u64 t0 = 0;
  for (;;) {
    const u64 x = oxccl_ld_acquire_sys(p);
    if (x >= v) {
      if (seen) *seen = x;
      return true;
    }
    if (!oxccl_keep_waiting(spins, t0, timeout_ns, abort)) return false;
  }
}

// Index of peer p among rank r's n-1 peers.
__device__ __forceinline__ u32 oxccl_pidx(u32 p, u32 r, u32 n) { return (p + n - r - 1) % n; }

// One channel's view of its connections, through the launch's FIFO: the
// simple one's parts or the LL one's (`ll`), which differ in offsets, slot
// size, counters and where the slots are.
struct OxChan {
  char* win;
  const WinHeader* h;
  u32 me, n, maxch, nslots, ch;
  bool ll;
  u64 slot_bytes, timeout_ns, abort, direct_from;
  u64 off_tail, off_head, off_size;

  __device__ __forceinline__ void init(const WinHeader* hdr, bool use_ll) {
    h = hdr;
    ll = use_ll;
    slot_bytes = ll ? h->ll_slot_bytes : h->slot_bytes;
    off_tail = ll ? h->off_tail_ll : h->off_tail;
    off_head = ll ? h->off_head_ll : h->off_head;
    off_size = ll ? h->off_size_ll : h->off_size;
  }
  __device__ __forceinline__ u64 cell(u32 q) const { return (u64)q * maxch + ch; }
  // In my area for p: data from p, p's posts, p's acks; my counters
  // towards p are in my window.
  __device__ __forceinline__ char* fifo_from(u32 p, u64 step) const {
    const char* base = ll ? (char*)h->mine[p] + h->off_fifo_ll : (char*)h->fifo_mine[p];
    return (char*)base + (cell(oxccl_pidx(p, me, n)) * nslots + step % nslots) * slot_bytes;
  }
  __device__ __forceinline__ volatile u64* tail_from(u32 p) const {
    return (volatile u64*)((char*)h->mine[p] + off_tail + cell(oxccl_pidx(p, me, n)) * OXCCL_FLAG_BYTES);
  }
  __device__ __forceinline__ volatile u64* head_from(u32 p) const {
    return (volatile u64*)((char*)h->mine[p] + off_head + cell(oxccl_pidx(p, me, n)) * OXCCL_FLAG_BYTES);
  }
  // The simple FIFO's counters towards p (OxShared's sent, recvd, head,
  // tail), then the LL one's.
  __device__ __forceinline__ u64* state(u32 p) const {
    return (u64*)(win + h->off_state) + cell(oxccl_pidx(p, me, n)) * 8 + (ll ? 4 : 0);
  }
  // In p's window (same layout): my data for p, my posts, my acks.
  __device__ __forceinline__ char* fifo_at(u32 p, u64 step) const {
    const char* base = ll ? (char*)h->peer[p] + h->off_fifo_ll : (char*)h->fifo_peer[p];
    return (char*)base + (cell(oxccl_pidx(me, p, n)) * nslots + step % nslots) * slot_bytes;
  }
  __device__ __forceinline__ volatile u64* tail_at(u32 p) const {
    return (volatile u64*)((char*)h->peer[p] + off_tail + cell(oxccl_pidx(me, p, n)) * OXCCL_FLAG_BYTES);
  }
  __device__ __forceinline__ volatile u64* head_at(u32 p) const {
    return (volatile u64*)((char*)h->peer[p] + off_head + cell(oxccl_pidx(me, p, n)) * OXCCL_FLAG_BYTES);
  }
  __device__ __forceinline__ volatile u64* size_at(u32 p, u64 step) const {
    return (volatile u64*)((char*)h->peer[p] + off_size) + cell(oxccl_pidx(me, p, n)) * nslots + step % nslots;
  }
  // The size word of slot `step` from p, in my area.
  __device__ __forceinline__ volatile u64* size_from(u32 p, u64 step) const {
    return (volatile u64*)((char*)h->mine[p] + off_size) + cell(oxccl_pidx(p, me, n)) * nslots + step % nslots;
  }
  // Makes a slice stored into p's slot `step` (`bytes` long) visible, then
  // posts it: the size first (a proxy sends that many bytes), then `tail`.
  __device__ __forceinline__ void post(u32 p, u64 step, u64 bytes) const {
    *size_at(p, step) = bytes;
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    oxccl_st_relaxed_sys(tail_at(p), step + 1);
  }
  // Posts slot `step` to p as the address of a slice p reads where it lies
  // (`bytes` long at `at`), once the block's stores to it are visible.
  __device__ __forceinline__ void post_direct(u32 p, u64 step, u64 bytes, const void* at) const {
    *(volatile u64*)fifo_at(p, step) = (u64)at;
    *size_at(p, step) = bytes | OXCCL_SIZE_DIRECT;
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    oxccl_st_relaxed_sys(tail_at(p), step + 1);
  }
};

// Per-block connection counters and the slots of the slice in progress;
// only a leader thread moves the counters.
struct OxShared {
  u64 sent[OXCCL_MAX_RANKS];
  u64 recvd[OXCCL_MAX_RANKS];
  // The highest head and tail each peer was seen to have posted. Both
  // counters live in this rank's area, which for shared-memory and net
  // peers is host memory, a PCIe round trip per read: a slot below
  // head + nslots is free, and a slice below tail is there, without another.
  // Kept across launches with the counters (as NCCL's step caches are).
  u64 head[OXCCL_MAX_RANKS];
  u64 tail[OXCCL_MAX_RANKS];
  // Slots claimed so far by a sending group whose workers run a slice
  // ahead of its posting warp (oxccl_side_by_side), which moves `sent`.
  u64 csent[OXCCL_MAX_RANKS];
  char* rbuf;
  char* sbuf;
  // Exchange: slices whose source the sending warps have read, so that the
  // receiving warps never overwrite (in place) a slice not yet sent.
  volatile u64 local_done;
  // Set by the thread that waits, before the barrier after which every
  // thread of its group reads it, so that the group leaves together: the
  // block's (and the exchange's sending group's), and the exchange's
  // receiving group's.
  volatile u32 aborted;
  volatile u32 aborted_recv;
  // The peers this launch posted slices to by address (a bit each), whose
  // reads the block waits for before it ends.
  volatile u64 direct_sent;
};

// A barrier among `n` threads of the block (named barrier `id`; 0 is
// __syncthreads), so that two warp groups synchronise independently.
__device__ __forceinline__ void oxccl_bar(u32 id, u32 n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

// Waits until slot `s` towards p is free (its step `nslots` back was
// consumed) and points sh.sbuf at it; false when aborted. One thread only.
__device__ __forceinline__ bool oxccl_claim_send(const OxChan& c, OxShared& sh, u32 p, u64 s) {
  const bool ok = s + 1 <= sh.head[p] + c.nslots ||
                  oxccl_wait_geq(c.head_from(p), s + 1 - c.nslots, c.timeout_ns, c.abort, &sh.head[p]);
  sh.sbuf = c.fifo_at(p, s);
  return ok;
}

// Waits until the next slice from p is posted and points sh.rbuf at it;
// false when aborted. Thread 0 only; the barrier after it orders the
// block's reads of the slice after the acquiring read of the tail.
__device__ __forceinline__ bool oxccl_claim_recv(const OxChan& c, OxShared& sh, u32 p) {
  const u64 r = sh.recvd[p];
  const bool ok = r < sh.tail[p] || oxccl_wait_geq(c.tail_from(p), r + 1, c.timeout_ns, c.abort, &sh.tail[p]);
  sh.rbuf = c.fifo_from(p, r);
  // A slice posted by address: read where it lies, in p's buffer. The size
  // word was stored before the tail that the wait acquired.
  if (ok && ((c.direct_from >> p) & 1) && (*c.size_from(p, r) & OXCCL_SIZE_DIRECT))
    sh.rbuf = (char*)*(const volatile u64*)sh.rbuf;
  return ok;
}

// The peers that read buffer `buf` (OXCCL_BUF_*) where it lies.
__device__ __forceinline__ u64 oxccl_direct_mask(const CollArgs& a, u8 buf) {
  return buf == OXCCL_BUF_INPUT ? a.direct_in : buf == OXCCL_BUF_OUTPUT ? a.direct_out : 0;
}

// Where a slice sent to `send` lies in memory that peer reads itself (see
// CollArgs::direct_in), or 0 (it goes through the slot): the step's
// destination, which holds what is sent, or its source when the slice is
// sent as it is (nothing received, nothing transformed).
template <typename T, typename Op>
__device__ __forceinline__ const T* oxccl_direct(const CollArgs& a, const OxChan& c, int send, bool recv, u8 src_buf,
                                                 const T* src, u8 dst_buf, const T* dst, u32 flags) {
  if (c.ll || send < 0) return 0;
  if (dst && ((oxccl_direct_mask(a, dst_buf) >> send) & 1)) return dst;
  const bool transform = (Op::PRE && (flags & (OXCCL_F_PRE_S | OXCCL_F_PRE_R))) || (Op::POST && (flags & OXCCL_F_POST));
  if (!recv && src && !transform && ((oxccl_direct_mask(a, src_buf) >> send) & 1)) return src;
  return 0;
}

// Thread 0 waits until the slices are there / the slots are free; then the
// block moves the data; then thread 0 publishes. The fence after the
// barrier orders every thread's stores to the peer before the flag. False
// (on every thread alike) when the launch was aborted: nothing was moved.
template <typename T, typename Op>
__device__ __forceinline__ bool oxccl_slice(const OxChan& c, OxShared& sh, int recv, int send, const T* src, T* dst,
                                            u64 n, u32 flags, const Scalars& sc, const T* direct) {
  if (threadIdx.x == 0) {
    bool ok = true;
    if (recv >= 0) ok = oxccl_claim_recv(c, sh, recv);
    if (ok && send >= 0) ok = oxccl_claim_send(c, sh, send, sh.sent[send]);
    if (!ok) sh.aborted = 1;
  }
  __syncthreads();
  if (sh.aborted) return false;
  oxccl_reduce_copy<T, Op>(src, recv >= 0 ? (const T*)sh.rbuf : 0, dst, send >= 0 && !direct ? (T*)sh.sbuf : 0, n,
                           flags, sc, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    if (send >= 0 && direct) {
      c.post_direct(send, sh.sent[send], n * sizeof(T), direct);
      sh.direct_sent = sh.direct_sent | (1ull << send);
      sh.sent[send]++;
    } else if (send >= 0) {
      c.post(send, sh.sent[send], n * sizeof(T));
      sh.sent[send]++;
    }
    if (recv >= 0) oxccl_st_relaxed_sys(c.head_at(recv), ++sh.recvd[recv]);
  }
  return true;
}

// The flag of an LL line of `step`: never 0 (fresh memory), never that of
// the steps that used the slot before (core/src/transport/layout.rs'
// `ll_flag`).
__device__ __forceinline__ u32 oxccl_ll_flag(u64 step) {
  const u32 f = (u32)step + 1;
  return f ? f : 1;
}

__device__ __forceinline__ void oxccl_st_ll(char* p, u64 v, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"((u32)v), "r"(flag),
               "r"((u32)(v >> 32)), "r"(flag)
               : "memory");
}

// Polls one line until both its flags are `flag`, as oxccl_wait_geq waits;
// false when aborted.
__device__ __forceinline__ bool oxccl_wait_ll(const char* p, u32 flag, u64* v, u64 timeout_ns, u64 abort) {
  u32 spins = 0;
  u64 t0 = 0;
  for (;;) {
    u32 a, f1, b, f2;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a), "=r"(f1), "=r"(b), "=r"(f2)
                 : "l"(p)
                 : "memory");
    if (f1 == flag && f2 == flag) {
      *v = (u64)a | ((u64)b << 32);
      return true;
    }
    if (!oxccl_keep_waiting(spins, t0, timeout_ns, abort)) return false;
  }
}

template <typename T> union OxLine {
  u64 u;
  T e[8 / sizeof(T)];
};

// oxccl_slice through the LL FIFO: each thread moves whole lines (8 bytes
// of data, the last one maybe part used), waiting on each line it receives
// by itself; only the slot's reuse (`head`) is waited for by thread 0.
// A plain copy moves the bits as they are, as oxccl_copy_loop does.
template <typename T, typename Op>
__device__ __noinline__ bool oxccl_slice_ll(const OxChan& c, OxShared& sh, int recv, int send, const T* src, T* dst,
                                            u64 n, u32 flags, const Scalars& sc) {
  const u32 E = 8 / sizeof(T);
  const u64 lines = (n + E - 1) / E;
  if (threadIdx.x == 0) {
    const bool ok = send < 0 || oxccl_claim_send(c, sh, send, sh.sent[send]);
    if (recv >= 0) sh.rbuf = c.fifo_from(recv, sh.recvd[recv]);
    if (!ok) sh.aborted = 1;
  }
  __syncthreads();
  if (sh.aborted) return false;
  const bool transform = (Op::PRE && (flags & (OXCCL_F_PRE_S | OXCCL_F_PRE_R))) || (Op::POST && (flags & OXCCL_F_POST));
  const u32 rflag = recv >= 0 ? oxccl_ll_flag(sh.recvd[recv]) : 0;
  const u32 sflag = send >= 0 ? oxccl_ll_flag(sh.sent[send]) : 0;
  for (u64 i = threadIdx.x; i < lines; i += blockDim.x) {
    const u64 e0 = i * E;
    const u32 m = (u32)min((u64)E, n - e0);
    OxLine<T> a, b, r;
    a.u = 0;
    b.u = 0;
    if (src)
      for (u32 k = 0; k < m; k++) a.e[k] = src[e0 + k];
    if (recv >= 0 && !oxccl_wait_ll(sh.rbuf + i * 16, rflag, &b.u, c.timeout_ns, c.abort)) {
      sh.aborted = 1;
      break;
    }
    if (src && recv >= 0) {
      r.u = 0;
      for (u32 k = 0; k < m; k++) r.e[k] = oxccl_elem<T, Op, true, true>(a.e[k], b.e[k], flags, sc);
    } else if (!transform) {
      r.u = src ? a.u : b.u;
    } else if (src) {
      r.u = 0;
      for (u32 k = 0; k < m; k++) r.e[k] = oxccl_elem<T, Op, true, false>(a.e[k], b.e[k], flags, sc);
    } else {
      r.u = 0;
      for (u32 k = 0; k < m; k++) r.e[k] = oxccl_elem<T, Op, false, true>(a.e[k], b.e[k], flags, sc);
    }
    if (dst)
      for (u32 k = 0; k < m; k++) dst[e0 + k] = r.e[k];
    if (send >= 0) oxccl_st_ll(sh.sbuf + i * 16, r.u, sflag);
  }
  __syncthreads();
  if (sh.aborted) return false;
  if (threadIdx.x == 0) {
    if (send >= 0) {
      // For a proxy only: it sends the slot once every line has its flag,
      // and clears the word again when it has.
      oxccl_st_relaxed_sys(c.size_at(send, sh.sent[send]), lines * 16);
      sh.sent[send]++;
    }
    if (recv >= 0) oxccl_st_relaxed_sys(c.head_at(recv), ++sh.recvd[recv]);
  }
  return true;
}

// One slice through the launch's FIFO.
template <typename T, typename Op>
__device__ __forceinline__ bool oxccl_move(const OxChan& c, OxShared& sh, int recv, int send, const T* src, T* dst,
                                           u64 n, u32 flags, const Scalars& sc, const T* direct = 0) {
  if (c.ll) return oxccl_slice_ll<T, Op>(c, sh, recv, send, src, dst, n, flags, sc);
  return oxccl_slice<T, Op>(c, sh, recv, send, src, dst, n, flags, sc, direct);
}

__device__ __forceinline__ void oxccl_chunk(u64 lo, u64 hi, u32 nchunks, u32 chunk, u64 align, u64* clo, u64* chi) {
  if (chunk == OXCCL_WHOLE) {
    *clo = lo;
    *chi = hi;
    return;
  }
  u64 cs = (hi - lo + nchunks - 1) / nchunks;
  cs = (cs + align - 1) / align * align;
  *clo = min(lo + (u64)chunk * cs, hi);
  *chi = min(*clo + cs, hi);
}

template <typename T> __device__ __forceinline__ T* oxccl_buf(const CollArgs& a, u8 buf, u16 block, u64 e) {
  if (buf == OXCCL_BUF_NONE) return 0;
  T* base = (T*)(buf == OXCCL_BUF_INPUT ? a.input : a.output);
  return base + (u64)block * a.count + e;
}

// Two steps run side by side by the block's two warp groups: the first
// group sends `ds`'s slices to its peer, the second takes `dr`'s slices
// from its peer as they arrive. Neither waits for the other's work, so the
// link is fed while the received slices are stored or reduced, and a
// group's flag fence stalls only itself. An exchange (recursive doubling;
// with two ranks the whole all-reduce) is one step that sends its source
// and combines the peer's with it: `ds` and `dr` are then the same step,
// and `guard` makes the receivers wait (in place) for the source of a
// slice to have been sent before they overwrite it. With two ranks, an
// all-gather or a reduce-scatter is a sending step and a receiving one
// whose source and destination do not meet. An abort ends each group at
// its next wait (the receivers' also once the senders left).
template <typename T, typename Op>
__device__ __forceinline__ void oxccl_side_by_side(const CollArgs& a, const OxChan& c, OxShared& sh, const DevStep& ds,
                                                   u64 slo, u64 shi, const DevStep& dr, u64 rlo, u64 rhi,
                                                   bool guard) {
  const u64 S = a.slice_elems;
  const u32 nsend = (blockDim.x / 64) * 32;
  const bool sender = threadIdx.x < nsend;
  const u32 tid = sender ? threadIdx.x : threadIdx.x - nsend;
  const u32 nthr = sender ? nsend : blockDim.x - nsend;
  if (sender) {
    const u64 ns = (shi - slo + S - 1) / S;
    const int peer = ds.send;
    const u32 pre = ds.src_buf == OXCCL_BUF_INPUT ? OXCCL_F_PRE_S : 0;
    // A slice sent as it is, the exchange's: the receivers finalise.
    const u32 fin = !guard && (ds.flags & OXCCL_STEP_FINALIZE) ? OXCCL_F_POST : 0;
    // Where the receiving group only copies (an all-gather, a send/recv
    // pair), the sending group's last warp posts and moves no data, so
    // that its fence (which waits until every store of the slice has
    // reached the peer, several microseconds over NVLink) overlaps the
    // other warps' next slice, as NCCL's extra warp does: an all-gather
    // of 16 MiB-1 GiB at 24 CTAs on 2 H200 took 4-12 % less time. Where it
    // reduces (a reduce-scatter, the exchange), or in the general loop
    // (a broadcast gained 2-6 % but a reduce lost 3-8 %), every warp moves
    // data and the first thread posts.
    const bool apart = !guard && dr.src_buf == OXCCL_BUF_NONE && nthr >= 64;
    const u32 nwork = apart ? nthr - 32 : nthr;
    const u32 poster = apart ? nwork : 0;
    for (u64 j = 0; j < ns; j++) {
      const u64 e0 = slo + j * S;
      const u64 ne = min(S, shi - e0);
      const T* src = oxccl_buf<T>(a, ds.src_buf, ds.src_block, e0);
      T* dst = guard ? 0 : oxccl_buf<T>(a, ds.dst_buf, ds.dst_block, e0);
      // The exchange's receivers overwrite the source in place: never read
      // by address.
      const T* direct = guard ? 0 : oxccl_direct<T, Op>(a, c, peer, false, ds.src_buf, src, ds.dst_buf, dst, pre | fin);
      if (tid < nwork) {
        if (tid == 0) {
          if (oxccl_claim_send(c, sh, peer, sh.csent[peer])) sh.csent[peer]++;
          else sh.aborted = 1;
        }
        oxccl_bar(3, nwork);
        if (!sh.aborted) oxccl_reduce_copy<T, Op>(src, 0, dst, direct ? 0 : (T*)sh.sbuf, ne, pre | fin, a.sc, tid, nwork);
      }
      oxccl_bar(1, nthr);
      if (sh.aborted) break;
      if (tid == poster) {
        if (direct) {
          c.post_direct(peer, sh.sent[peer], ne * sizeof(T), direct);
          sh.direct_sent = sh.direct_sent | (1ull << peer);
        } else {
          c.post(peer, sh.sent[peer], ne * sizeof(T));
        }
        sh.sent[peer]++;
        sh.local_done = j + 1;
      }
    }
  } else {
    const u64 ns = (rhi - rlo + S - 1) / S;
    const int peer = dr.recv;
    const u32 pre = dr.src_buf == OXCCL_BUF_INPUT ? OXCCL_F_PRE_S : 0;
    const u32 fin = (dr.flags & OXCCL_STEP_FINALIZE) ? OXCCL_F_POST : 0;
    for (u64 j = 0; j < ns; j++) {
      const u64 e0 = rlo + j * S;
      const u64 ne = min(S, rhi - e0);
      if (tid == 0) {
        bool ok = oxccl_claim_recv(c, sh, peer);
        // Senders that left never get further.
        while (ok && guard && sh.local_done <= j) {
          if (sh.aborted) ok = false;
        }
        if (!ok) sh.aborted_recv = 1;
      }
      oxccl_bar(2, nthr);
      if (sh.aborted_recv) break;
      oxccl_reduce_copy<T, Op>(oxccl_buf<T>(a, dr.src_buf, dr.src_block, e0), (const T*)sh.rbuf,
                               oxccl_buf<T>(a, dr.dst_buf, dr.dst_block, e0), 0, ne,
                               pre | fin | (guard ? OXCCL_F_ROUND : 0), a.sc, tid, nthr);
      oxccl_bar(2, nthr);
      if (tid == 0) oxccl_st_relaxed_sys(c.head_at(peer), ++sh.recvd[peer]);
    }
  }
}

// Whether the steps of a launch are a sending step and a receiving one
// that may run side by side: neither waits on the other, and the first
// reads nothing the second writes (in place, an all-gather's own block
// and a reduce-scatter's are not the ones received).
template <typename T>
__device__ __forceinline__ bool oxccl_pair(const CollArgs& a, u64 slo, u64 shi, u64 rlo, u64 rhi) {
  if (a.nsteps != 2) return false;
  const DevStep& s = a.steps[0];
  const DevStep& r = a.steps[1];
  const u32 special = OXCCL_STEP_SEND_LOCAL | OXCCL_STEP_EVEN_CH | OXCCL_STEP_ODD_CH;
  if (s.send < 0 || s.recv >= 0 || r.recv < 0 || r.send >= 0 || ((s.flags | r.flags) & special)) return false;
  if (s.src_buf == OXCCL_BUF_NONE || r.dst_buf == OXCCL_BUF_NONE) return true;
  const u64 a0 = (u64)oxccl_buf<T>(a, s.src_buf, s.src_block, slo), a1 = a0 + (shi - slo) * sizeof(T);
  const u64 b0 = (u64)oxccl_buf<T>(a, r.dst_buf, r.dst_block, rlo), b1 = b0 + (rhi - rlo) * sizeof(T);
  return a1 <= b0 || b1 <= a0;
}

template <typename T, typename Op> __device__ __forceinline__ void oxccl_coll_body(const CollArgs& a) {
  __shared__ OxShared sh;
  OxChan c;
  c.win = (char*)a.comm;
  c.init((const WinHeader*)a.comm, a.proto == OXCCL_PROTO_LL);
  c.me = c.h->rank;
  c.n = c.h->nranks;
  c.maxch = c.h->maxch;
  c.nslots = c.h->nslots;
  c.timeout_ns = a.timeout_ns;
  c.abort = a.abort;
  c.direct_from = c.ll ? 0 : a.direct_from;
  c.ch = blockIdx.x;

  // The channel's range: an equal share, a multiple of 16 bytes, so that
  // chunk and slice boundaries stay aligned wherever the buffers are.
  const u64 V = 16 / sizeof(T);
  u64 per = (a.count + a.nchannels - 1) / a.nchannels;
  per = (per + V - 1) / V * V;
  const u64 lo = min((u64)c.ch * per, a.count);
  const u64 hi = min(lo + per, a.count);
  if (lo >= hi) return;

  for (u32 p = threadIdx.x; p < c.n; p += blockDim.x) {
    if (p == c.me) continue;
    const u64* st = c.state(p);
    sh.sent[p] = st[0];
    sh.recvd[p] = st[1];
    sh.head[p] = st[2];
    sh.tail[p] = st[3];
    sh.csent[p] = st[0];
  }
  if (threadIdx.x == 0) {
    sh.local_done = 0;
    sh.aborted = 0;
    sh.aborted_recv = 0;
    sh.direct_sent = 0;
  }
  __syncthreads();

  const u64 S = a.slice_elems;
  // LL slices take the general loop: its exchange sends a group, then
  // receives it, with no fence for the sending warps to hide.
  u64 slo = lo, shi = hi, rlo = lo, rhi = hi;
  if (a.nsteps == 2) {
    oxccl_chunk(lo, hi, a.nchunks, a.steps[0].chunk, V, &slo, &shi);
    oxccl_chunk(lo, hi, a.nchunks, a.steps[1].chunk, V, &rlo, &rhi);
  }
  if (!c.ll && a.nsteps == 1 && (a.steps[0].flags & OXCCL_STEP_SEND_LOCAL)) {
    oxccl_side_by_side<T, Op>(a, c, sh, a.steps[0], lo, hi, a.steps[0], lo, hi, true);
  } else if (!c.ll && oxccl_pair<T>(a, slo, shi, rlo, rhi)) {
    oxccl_side_by_side<T, Op>(a, c, sh, a.steps[0], slo, shi, a.steps[1], rlo, rhi, false);
  } else {
    // Group-major order, as NCCL's loops: every step advances `group`
    // slices (a chunk) before any step takes the next group, so a ring never
    // waits on a FIFO that only a later step of its neighbour would drain (a
    // group is at most half the FIFO: two in flight never fill it). Groups of
    // several slices let a rank run ahead of a peer that is not running at
    // the moment (a process time-sliced on one GPU, a proxy between hosts).
    const u64 G = (u64)max(a.group, 1u) * S;
    for (u64 j = 0;; j++) {
      bool any = false;
      for (u32 s = 0; s < a.nsteps; s++) {
        const DevStep& d = a.steps[s];
        if (d.flags & ((c.ch & 1) ? OXCCL_STEP_EVEN_CH : OXCCL_STEP_ODD_CH)) continue;
        u64 clo, chi;
        oxccl_chunk(lo, hi, a.nchunks, d.chunk, V, &clo, &chi);
        const u64 g0 = clo + j * G;
        if (g0 >= chi) continue;
        any = true;
        const u64 g1 = min(g0 + G, chi);
        const u32 pre = d.src_buf == OXCCL_BUF_INPUT ? OXCCL_F_PRE_S : 0;
        const u32 fin = (d.flags & OXCCL_STEP_FINALIZE) ? OXCCL_F_POST : 0;
        if (d.flags & OXCCL_STEP_SEND_LOCAL) {
          for (u64 e0 = g0; e0 < g1; e0 += S)
            if (!oxccl_move<T, Op>(c, sh, -1, d.send, oxccl_buf<T>(a, d.src_buf, d.src_block, e0), 0, min(S, g1 - e0),
                                    pre, a.sc))
              return;
          for (u64 e0 = g0; e0 < g1; e0 += S)
            if (!oxccl_move<T, Op>(c, sh, d.recv, -1, oxccl_buf<T>(a, d.src_buf, d.src_block, e0),
                                    oxccl_buf<T>(a, d.dst_buf, d.dst_block, e0), min(S, g1 - e0),
                                    pre | fin | OXCCL_F_ROUND, a.sc))
              return;
        } else {
          for (u64 e0 = g0; e0 < g1; e0 += S) {
            const T* src = oxccl_buf<T>(a, d.src_buf, d.src_block, e0);
            T* dst = oxccl_buf<T>(a, d.dst_buf, d.dst_block, e0);
            const T* direct = oxccl_direct<T, Op>(a, c, d.send, d.recv >= 0, d.src_buf, src, d.dst_buf, dst, pre | fin);
            if (!oxccl_move<T, Op>(c, sh, d.recv, d.send, src, dst, min(S, g1 - e0), pre | fin, a.sc, direct)) return;
          }
        }
      }
      if (!any) break;
    }
  }

  __syncthreads();
  // An aborted launch leaves its counters where they were: the
  // communicator is revoked, and no launch of it runs again.
  if (sh.aborted || sh.aborted_recv) return;
  // Slices posted by address are read from the caller's buffers, which
  // are the caller's again once the launch ends: wait for the peers to
  // have taken every one (their head reaches what was sent).
  if (sh.direct_sent) {
    if (threadIdx.x == 0) {
      for (u32 p = 0; p < c.n; p++)
        if (((sh.direct_sent >> p) & 1) &&
            !oxccl_wait_geq(c.head_from(p), sh.sent[p], c.timeout_ns, c.abort, &sh.head[p]))
          sh.aborted = 1;
    }
    __syncthreads();
    if (sh.aborted) return;
  }
  for (u32 p = threadIdx.x; p < c.n; p += blockDim.x) {
    if (p == c.me) continue;
    u64* st = c.state(p);
    st[0] = sh.sent[p];
    st[1] = sh.recvd[p];
    st[2] = sh.head[p];
    st[3] = sh.tail[p];
  }
}

// The host polls these words while the kernel runs, so they go out at
// system scope; the end stamp follows every thread of the block (the
// early return of a block without work is taken by the whole block).
__device__ __forceinline__ void oxccl_stamp(u64 stamps, u32 word) {
  oxccl_st_relaxed_sys((volatile u64*)stamps + 2 * blockIdx.x + word, oxccl_globaltimer());
}

template <typename T, typename Op>
__global__ void __launch_bounds__(1024, 1) oxccl_coll(const __grid_constant__ CollArgs a) {
  if (a.stamps && threadIdx.x == 0) oxccl_stamp(a.stamps, 0);
  oxccl_coll_body<T, Op>(a);
  if (a.stamps) {
    __syncthreads();
    if (threadIdx.x == 0) oxccl_stamp(a.stamps, 1);
  }
}
