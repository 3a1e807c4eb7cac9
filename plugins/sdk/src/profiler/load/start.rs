//! Starting an event: one function per kind of event (what NCCL runs:
//! group, collective, p2p; the proxy's op, step and control; a kernel
//! channel; a net plugin's own; the API events of v5 and later), each
//! building the descriptor of the version loaded from the core's one
//! [`Event`].
#![allow(unsafe_code)]

use super::*;

const SIMPLE: &CStr = c"SIMPLE";

/// Every descriptor field the core fills, from one event (zero where the
/// event has no such field).
struct Fields {
    seq: u64,
    func: *const c_char,
    count: usize,
    root: c_int,
    dtype: *const c_char,
    algo: *const c_char,
    nch: u8,
    peer: c_int,
    parent: *mut c_void,
    codes: Codes,
    channel: u8,
    n_steps: c_int,
    chunk_size: c_int,
    is_send: c_int,
    step: c_int,
    p_timer: u64,
    /// v5+: the API parent of a collective or p2p event.
    api: *mut c_void,
    /// A net-plugin event's id and data.
    net_id: i64,
    net_data: *mut c_void,
    /// v7: the caller's tag of a collective or p2p event.
    user_tag: u64,
}

impl Fields {
    fn of(ev: &Event<'_>) -> Fields {
        let mut f = Fields {
            seq: 0,
            func: std::ptr::null(),
            count: 0,
            root: 0,
            dtype: std::ptr::null(),
            algo: std::ptr::null(),
            nch: 0,
            peer: 0,
            parent: null_mut(),
            codes: Codes::default(),
            channel: 0,
            n_steps: 0,
            chunk_size: 0,
            is_send: 0,
            step: 0,
            p_timer: 0,
            api: null_mut(),
            net_id: 0,
            net_data: null_mut(),
            user_tag: 0,
        };
        match *ev {
            // Built by `CProfiler::start_api`.
            Event::GroupApi { .. }
            | Event::CollApi { .. }
            | Event::P2pApi { .. }
            | Event::KernelLaunch { .. } => {}
            Event::Group | Event::ProxyCtrl => {}
            Event::Coll {
                seq,
                func,
                count,
                root,
                dtype,
                algo,
                nchannels,
                parent,
                api,
                user_tag,
                codes,
            } => {
                f.user_tag = user_tag;
                f.api = api.0;
                f.seq = seq;
                f.func = func.as_ptr();
                f.count = count;
                f.root = root;
                f.dtype = dtype.as_ptr();
                f.algo = algo.as_ptr();
                f.nch = nchannels;
                f.parent = parent.0;
                f.codes = codes;
            }
            Event::P2p {
                func,
                count,
                dtype,
                peer,
                nchannels,
                parent,
                api,
                user_tag,
                codes,
            } => {
                f.user_tag = user_tag;
                f.api = api.0;
                f.func = func.as_ptr();
                f.count = count;
                f.dtype = dtype.as_ptr();
                f.nch = nchannels;
                f.peer = peer;
                f.parent = parent.0;
                f.codes = codes;
            }
            Event::ProxyOp {
                parent,
                channel,
                peer,
                n_steps,
                chunk_size,
                is_send,
            } => {
                f.parent = parent.0;
                f.channel = channel;
                f.peer = peer;
                f.n_steps = n_steps;
                f.chunk_size = chunk_size;
                f.is_send = is_send as c_int;
            }
            Event::ProxyStep { parent, step } => {
                f.parent = parent.0;
                f.step = step;
            }
            Event::NetPlugin { parent, id, data } => {
                f.parent = parent.0;
                f.net_id = id;
                f.net_data = data;
            }
            Event::KernelCh {
                parent,
                channel,
                p_timer,
            } => {
                f.parent = parent.0;
                f.channel = channel;
                f.p_timer = p_timer;
            }
        }
        f
    }
}

impl CProfiler {
    /// Starts an event: one function per kind of event, each building the
    /// descriptor of the version loaded.
    pub fn start(&self, ctx: &Ctx, rank: c_int, comm_hash: u64, ev: &Event<'_>) -> Handle {
        match ev {
            Event::GroupApi { .. }
            | Event::CollApi { .. }
            | Event::P2pApi { .. }
            | Event::KernelLaunch { .. } => self.start_api(ctx, rank, ev),
            Event::Group | Event::Coll { .. } | Event::P2p { .. } => {
                self.start_task(ctx, rank, comm_hash, ev)
            }
            Event::ProxyOp { .. } | Event::ProxyStep { .. } | Event::ProxyCtrl => {
                self.start_proxy(ctx, rank, ev)
            }
            Event::KernelCh { .. } => self.start_kernel_ch(ctx, rank, ev),
            Event::NetPlugin { .. } => self.start_net_plugin(ctx, rank, ev),
        }
    }

    /// A group, collective or p2p event as NCCL runs it.
    fn start_task(&self, ctx: &Ctx, rank: c_int, comm_hash: u64, ev: &Event<'_>) -> Handle {
        let f = Fields::of(ev);
        let ty = match ev {
            Event::Coll { .. } => NCCL_PROFILE_COLL,
            Event::P2p { .. } => NCCL_PROFILE_P2P,
            _ => NCCL_PROFILE_GROUP,
        };
        // From v5 on the parent of a collective or p2p is its API event;
        // the group is `parentGroup` (NCCL's profiler.cc).
        let parent = if ty != NCCL_PROFILE_GROUP && self.version >= 5 {
            f.api
        } else {
            f.parent
        };
        // A group carries no detail; a collective or p2p its member.
        macro_rules! task {
            ($v:expr, $descr:ty, $int:ty, $coll:expr, $p2p:expr) => {
                match ty {
                    NCCL_PROFILE_COLL => {
                        start_event!(ctx, $v, $descr, $int, ty, rank, parent, $coll)
                    }
                    NCCL_PROFILE_P2P => start_event!(ctx, $v, $descr, $int, ty, rank, parent, $p2p),
                    _ => start_event!(ctx, $v, $descr, $int, ty, rank, parent),
                }
            };
        }
        let coll5 = v5::CollDescrV5 {
            seq_number: f.seq,
            func: f.func,
            send_buff: std::ptr::null(),
            recv_buff: null_mut(),
            count: f.count,
            root: f.root,
            datatype: f.dtype,
            n_channels: f.nch,
            n_warps: 0,
            algo: f.algo,
            proto: SIMPLE.as_ptr(),
            parent_group: f.parent,
        };
        let p2p5 = v5::P2pDescrV5 {
            func: f.func,
            buff: null_mut(),
            datatype: f.dtype,
            count: f.count,
            peer: f.peer,
            n_channels: f.nch,
            parent_group: f.parent,
        };
        let coll7 = v7::CollDescrV7 {
            seq_number: f.seq,
            func: f.func,
            send_buff: std::ptr::null(),
            recv_buff: null_mut(),
            count: f.count,
            root: f.root,
            datatype: f.dtype,
            n_channels: f.nch,
            n_warps: 0,
            algo: f.algo,
            proto: SIMPLE.as_ptr(),
            parent_group: f.parent,
            kernel_variant: std::ptr::null(),
            is_sym_coll: false,
            user_tag: f.user_tag,
        };
        let p2p7 = v7::P2pDescrV7 {
            func: f.func,
            buff: null_mut(),
            datatype: f.dtype,
            count: f.count,
            peer: f.peer,
            n_channels: f.nch,
            parent_group: f.parent,
            user_tag: f.user_tag,
        };
        // Before v4 descriptors name the communicator by its hash.
        let (cname_, hash) = (c"".as_ptr(), comm_hash);
        let codes = f.codes;
        match self.vt {
            Vt::V1(v) => task!(
                v,
                v1::EventDescrV1,
                u8,
                v1::EventDetailV1 {
                    coll: v1::CollDescrV1 {
                        name: cname_,
                        comm_hash: hash,
                        seq_number: f.seq,
                        func: codes.func,
                        send_buff: std::ptr::null(),
                        recv_buff: null_mut(),
                        count: f.count,
                        root: f.root,
                        datatype: codes.dtype,
                        op: codes.op,
                        traffic_bytes: 0,
                        n_max_channels: f.nch,
                        n_warps: 0,
                        algo: codes.algo,
                        proto: 2,
                        is_collnet: 0,
                        is_nvls: 0,
                    }
                },
                v1::EventDetailV1 {
                    p2p: v1::P2pDescrV1 {
                        name: cname_,
                        comm_hash: hash,
                        func: codes.func,
                        buff: null_mut(),
                        datatype: codes.dtype,
                        count: f.count,
                        peer: f.peer,
                    }
                }
            ),
            Vt::V2(v) => task!(
                v,
                v2::EventDescrV2,
                u8,
                v2::EventDetailV2 {
                    coll: v2::CollDescrV2 {
                        name: cname_,
                        comm_hash: hash,
                        seq_number: f.seq,
                        func: f.func,
                        send_buff: std::ptr::null(),
                        recv_buff: null_mut(),
                        count: f.count,
                        root: f.root,
                        datatype: f.dtype,
                        traffic_bytes: 0,
                        n_max_channels: f.nch,
                        n_warps: 0,
                        algo: f.algo,
                        proto: SIMPLE.as_ptr(),
                    }
                },
                v2::EventDetailV2 {
                    p2p: v2::P2pDescrV2 {
                        name: cname_,
                        comm_hash: hash,
                        func: f.func,
                        buff: null_mut(),
                        datatype: f.dtype,
                        count: f.count,
                        peer: f.peer,
                    }
                }
            ),
            Vt::V3(v) => task!(
                v,
                v3::EventDescrV3,
                u8,
                v3::EventDetailV3 {
                    coll: v3::CollDescrV3 {
                        name: cname_,
                        comm_hash: hash,
                        seq_number: f.seq,
                        func: f.func,
                        send_buff: std::ptr::null(),
                        recv_buff: null_mut(),
                        count: f.count,
                        root: f.root,
                        datatype: f.dtype,
                        n_max_channels: f.nch,
                        n_warps: 0,
                        algo: f.algo,
                        proto: SIMPLE.as_ptr(),
                    }
                },
                v3::EventDetailV3 {
                    p2p: v3::P2pDescrV3 {
                        name: cname_,
                        comm_hash: hash,
                        func: f.func,
                        buff: null_mut(),
                        datatype: f.dtype,
                        count: f.count,
                        peer: f.peer,
                    }
                }
            ),
            Vt::V4(v) => task!(
                v,
                v4::EventDescrV4,
                u8,
                v4::EventDetailV4 {
                    coll: v4::CollDescrV4 {
                        seq_number: f.seq,
                        func: f.func,
                        send_buff: std::ptr::null(),
                        recv_buff: null_mut(),
                        count: f.count,
                        root: f.root,
                        datatype: f.dtype,
                        n_channels: f.nch,
                        n_warps: 0,
                        algo: f.algo,
                        proto: SIMPLE.as_ptr(),
                    }
                },
                v4::EventDetailV4 {
                    p2p: v4::P2pDescrV4 {
                        func: f.func,
                        buff: null_mut(),
                        datatype: f.dtype,
                        count: f.count,
                        peer: f.peer,
                        n_channels: f.nch,
                    }
                }
            ),
            Vt::V5(v) => task!(
                v,
                v5::EventDescrV5,
                u64,
                v5::EventDetailV5 { coll: coll5 },
                v5::EventDetailV5 { p2p: p2p5 }
            ),
            Vt::V6(v) => task!(
                v,
                v6::EventDescrV6,
                u64,
                v6::EventDetailV6 { coll: coll5 },
                v6::EventDetailV6 { p2p: p2p5 }
            ),
            Vt::V7(v) => task!(
                v,
                v7::EventDescrV7,
                u64,
                v7::EventDetailV7 { coll: coll7 },
                v7::EventDetailV7 { p2p: p2p7 }
            ),
        }
    }

    /// A proxy-op, proxy-step or proxy-control event.
    fn start_proxy(&self, ctx: &Ctx, rank: c_int, ev: &Event<'_>) -> Handle {
        let f = Fields::of(ev);
        let (ty, rank) = match ev {
            Event::ProxyOp { .. } => (NCCL_PROFILE_PROXY_OP, rank),
            Event::ProxyStep { .. } => (NCCL_PROFILE_PROXY_STEP, rank),
            // NCCL's descriptor carries the type alone: rank 0 and no
            // detail (profiler.cc zeroes the rest).
            _ => (NCCL_PROFILE_PROXY_CTRL, 0),
        };
        let parent = f.parent;
        macro_rules! proxy {
            ($v:expr, $descr:ty, $int:ty, $op:expr, $step:expr) => {
                match ty {
                    NCCL_PROFILE_PROXY_OP => {
                        start_event!(ctx, $v, $descr, $int, ty, rank, parent, $op)
                    }
                    NCCL_PROFILE_PROXY_STEP => {
                        start_event!(ctx, $v, $descr, $int, ty, rank, parent, $step)
                    }
                    _ => start_event!(ctx, $v, $descr, $int, ty, rank, parent),
                }
            };
        }
        // The proxy-op descriptor is the same in every version; only its
        // type name changes.
        macro_rules! op {
            ($m:ident :: $t:ident) => {
                $m::$t {
                    pid: std::process::id() as crate::ffi::Pid,
                    channel_id: f.channel,
                    peer: f.peer,
                    n_steps: f.n_steps,
                    chunk_size: f.chunk_size,
                    is_send: f.is_send,
                }
            };
        }
        match self.vt {
            Vt::V1(v) => proxy!(
                v,
                v1::EventDescrV1,
                u8,
                v1::EventDetailV1 {
                    proxy_op: op!(v1::ProxyOpDescrV1)
                },
                v1::EventDetailV1 {
                    proxy_step: v1::ProxyStepDescrV1 { step: f.step }
                }
            ),
            Vt::V2(v) => proxy!(
                v,
                v2::EventDescrV2,
                u8,
                v2::EventDetailV2 {
                    proxy_op: op!(v2::ProxyOpDescrV2)
                },
                v2::EventDetailV2 {
                    proxy_step: v2::ProxyStepDescrV2 { step: f.step }
                }
            ),
            Vt::V3(v) => proxy!(
                v,
                v3::EventDescrV3,
                u8,
                v3::EventDetailV3 {
                    proxy_op: op!(v3::ProxyOpDescrV3)
                },
                v3::EventDetailV3 {
                    proxy_step: v3::ProxyStepDescrV3 { step: f.step }
                }
            ),
            Vt::V4(v) => proxy!(
                v,
                v4::EventDescrV4,
                u8,
                v4::EventDetailV4 {
                    proxy_op: op!(v4::ProxyOpDescrV4)
                },
                v4::EventDetailV4 {
                    proxy_step: v4::ProxyStepDescrV4 { step: f.step }
                }
            ),
            Vt::V5(v) => proxy!(
                v,
                v5::EventDescrV5,
                u64,
                v5::EventDetailV5 {
                    proxy_op: op!(v5::ProxyOpDescrV5)
                },
                v5::EventDetailV5 {
                    proxy_step: v5::ProxyStepDescrV5 { step: f.step }
                }
            ),
            Vt::V6(v) => proxy!(
                v,
                v6::EventDescrV6,
                u64,
                v6::EventDetailV6 {
                    proxy_op: op!(v5::ProxyOpDescrV5)
                },
                v6::EventDetailV6 {
                    proxy_step: v5::ProxyStepDescrV5 { step: f.step }
                }
            ),
            Vt::V7(v) => proxy!(
                v,
                v7::EventDescrV7,
                u64,
                v7::EventDetailV7 {
                    proxy_op: op!(v5::ProxyOpDescrV5)
                },
                v7::EventDetailV7 {
                    proxy_step: v5::ProxyStepDescrV5 { step: f.step }
                }
            ),
        }
    }

    /// A kernel channel's event (v3 and later; NCCL's v1 and v2 adapters
    /// drop it).
    fn start_kernel_ch(&self, ctx: &Ctx, rank: c_int, ev: &Event<'_>) -> Handle {
        let f = Fields::of(ev);
        let ty = NCCL_PROFILE_KERNEL_CH;
        let kch5 = v5::KernelChDescrV5 {
            channel_id: f.channel,
            p_timer: f.p_timer,
        };
        match self.vt {
            Vt::V1(_) | Vt::V2(_) => Handle::NONE,
            Vt::V3(v) => start_event!(
                ctx,
                v,
                v3::EventDescrV3,
                u8,
                ty,
                rank,
                f.parent,
                v3::EventDetailV3 {
                    kernel_ch: v3::KernelChDescrV3 {
                        channel_id: f.channel
                    }
                }
            ),
            Vt::V4(v) => start_event!(
                ctx,
                v,
                v4::EventDescrV4,
                u8,
                ty,
                rank,
                f.parent,
                v4::EventDetailV4 {
                    kernel_ch: v4::KernelChDescrV4 {
                        channel_id: f.channel,
                        p_timer: f.p_timer,
                    }
                }
            ),
            Vt::V5(v) => start_event!(
                ctx,
                v,
                v5::EventDescrV5,
                u64,
                ty,
                rank,
                f.parent,
                v5::EventDetailV5 { kernel_ch: kch5 }
            ),
            Vt::V6(v) => start_event!(
                ctx,
                v,
                v6::EventDescrV6,
                u64,
                ty,
                rank,
                f.parent,
                v6::EventDetailV6 { kernel_ch: kch5 }
            ),
            Vt::V7(v) => start_event!(
                ctx,
                v,
                v7::EventDescrV7,
                u64,
                ty,
                rank,
                f.parent,
                v7::EventDetailV7 { kernel_ch: kch5 }
            ),
        }
    }

    /// An event the net plugin defined (v3 and later; NCCL's v1 and v2
    /// adapters drop it).
    fn start_net_plugin(&self, ctx: &Ctx, rank: c_int, ev: &Event<'_>) -> Handle {
        let f = Fields::of(ev);
        let ty = NCCL_PROFILE_NET_PLUGIN;
        let net5 = v5::NetPluginDescrV5 {
            id: f.net_id,
            data: f.net_data,
        };
        match self.vt {
            Vt::V1(_) | Vt::V2(_) => Handle::NONE,
            Vt::V3(v) => start_event!(
                ctx,
                v,
                v3::EventDescrV3,
                u8,
                ty,
                rank,
                f.parent,
                v3::EventDetailV3 {
                    net_plugin: v3::NetPluginDescrV3 {
                        id: f.net_id,
                        data: f.net_data,
                    }
                }
            ),
            Vt::V4(v) => start_event!(
                ctx,
                v,
                v4::EventDescrV4,
                u8,
                ty,
                rank,
                f.parent,
                v4::EventDetailV4 {
                    net_plugin: v4::NetPluginDescrV4 {
                        id: f.net_id,
                        data: f.net_data,
                    }
                }
            ),
            Vt::V5(v) => start_event!(
                ctx,
                v,
                v5::EventDescrV5,
                u64,
                ty,
                rank,
                f.parent,
                v5::EventDetailV5 { net_plugin: net5 }
            ),
            Vt::V6(v) => start_event!(
                ctx,
                v,
                v6::EventDescrV6,
                u64,
                ty,
                rank,
                f.parent,
                v6::EventDetailV6 { net_plugin: net5 }
            ),
            Vt::V7(v) => start_event!(
                ctx,
                v,
                v7::EventDescrV7,
                u64,
                ty,
                rank,
                f.parent,
                v7::EventDetailV7 { net_plugin: net5 }
            ),
        }
    }

    /// An API event (v5 and later; NCCL's adapters of older versions drop
    /// them): the descriptor as NCCL's profiler.cc fills it, built as v7's
    /// (whose API members end with the caller's tag) and cut down to v5's
    /// members for v5 and v6.
    fn start_api(&self, ctx: &Ctx, rank: c_int, ev: &Event<'_>) -> Handle {
        let (ty, parent, detail) = match *ev {
            Event::GroupApi { depth } => (
                NCCL_PROFILE_GROUP_API,
                null_mut(),
                v7::EventDetailV7 {
                    group_api: v5::GroupApiDescrV5 {
                        graph_captured: false,
                        group_depth: depth,
                    },
                },
            ),
            Event::CollApi {
                func,
                count,
                dtype,
                root,
                parent,
                user_tag,
            } => (
                NCCL_PROFILE_COLL_API,
                parent.0,
                v7::EventDetailV7 {
                    coll_api: v7::CollApiDescrV7 {
                        func: func.as_ptr(),
                        count,
                        datatype: dtype.as_ptr(),
                        root,
                        stream: null_mut(),
                        graph_captured: false,
                        user_tag,
                    },
                },
            ),
            Event::P2pApi {
                func,
                count,
                dtype,
                parent,
                user_tag,
            } => (
                NCCL_PROFILE_P2P_API,
                parent.0,
                v7::EventDetailV7 {
                    p2p_api: v7::P2pApiDescrV7 {
                        func: func.as_ptr(),
                        count,
                        datatype: dtype.as_ptr(),
                        stream: null_mut(),
                        graph_captured: false,
                        user_tag,
                    },
                },
            ),
            Event::KernelLaunch { parent, stream } => (
                NCCL_PROFILE_KERNEL_LAUNCH,
                parent.0,
                v7::EventDetailV7 {
                    kernel_launch: v5::KernelLaunchDescrV5 { stream },
                },
            ),
            _ => return Handle::NONE,
        };
        let mut h = null_mut();
        if let Vt::V7(v) = self.vt {
            let mut d = v7::EventDescrV7 {
                ty: ty as u64,
                parent_obj: parent,
                rank,
                detail,
            };
            // SAFETY: entry checked non-null at load; the descriptor lives
            // for the call.
            let _ = unsafe { v.start_event.expect("checked")(ctx.ptr, &mut h, &mut d) };
            return Handle(h);
        }
        // v5's API members, which v6 keeps: v7's without the tag.
        // SAFETY: the member read is the one written above for `ty`.
        let detail5 = unsafe {
            match ty {
                NCCL_PROFILE_GROUP_API => v5::EventDetailV5 {
                    group_api: detail.group_api,
                },
                NCCL_PROFILE_COLL_API => {
                    let c = detail.coll_api;
                    v5::EventDetailV5 {
                        coll_api: v5::CollApiDescrV5 {
                            func: c.func,
                            count: c.count,
                            datatype: c.datatype,
                            root: c.root,
                            stream: c.stream,
                            graph_captured: c.graph_captured,
                        },
                    }
                }
                NCCL_PROFILE_P2P_API => {
                    let p = detail.p2p_api;
                    v5::EventDetailV5 {
                        p2p_api: v5::P2pApiDescrV5 {
                            func: p.func,
                            count: p.count,
                            datatype: p.datatype,
                            stream: p.stream,
                            graph_captured: p.graph_captured,
                        },
                    }
                }
                _ => v5::EventDetailV5 {
                    kernel_launch: detail.kernel_launch,
                },
            }
        };
        match self.vt {
            Vt::V6(v) => {
                // SAFETY: a zeroed descriptor is valid.
                let mut d: v6::EventDescrV6 = unsafe { std::mem::zeroed() };
                d.ty = ty as u64;
                d.parent_obj = parent;
                d.rank = rank;
                // SAFETY: copying the member just written (all four API
                // members are v5 types, members of v6's union too).
                unsafe {
                    match ty {
                        NCCL_PROFILE_GROUP_API => d.detail.group_api = detail5.group_api,
                        NCCL_PROFILE_COLL_API => d.detail.coll_api = detail5.coll_api,
                        NCCL_PROFILE_P2P_API => d.detail.p2p_api = detail5.p2p_api,
                        _ => d.detail.kernel_launch = detail5.kernel_launch,
                    }
                }
                // SAFETY: entry checked non-null at load; the descriptor
                // lives for the call.
                let _ = unsafe { v.start_event.expect("checked")(ctx.ptr, &mut h, &mut d) };
            }
            Vt::V5(v) => {
                let mut d = v5::EventDescrV5 {
                    ty: ty as u64,
                    parent_obj: parent,
                    rank,
                    detail: detail5,
                };
                // SAFETY: as for v6.
                let _ = unsafe { v.start_event.expect("checked")(ctx.ptr, &mut h, &mut d) };
            }
            _ => return Handle::NONE,
        }
        Handle(h)
    }
}
