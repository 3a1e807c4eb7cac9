/*
 * A fake libibverbs.so.1 for tests: one device ("fake0", one active port)
 * whose "NIC" moves data inside this process. It is compiled against the
 * system's rdma-core <infiniband/verbs.h>, so the plugin's Rust layouts
 * (work requests, completions, QP attributes, the context's ops table) meet
 * the real ones. It checks what real hardware would refuse: attribute masks
 * of each QP transition, posting in the wrong state, keys that do not cover
 * the buffer, a message larger than its receive.
 *
 * FAKE_IBV_LINK=eth makes the port RoCE (then RTR must carry a global route);
 * FAKE_IBV_EXPECT_TIMEOUT / FAKE_IBV_EXPECT_RETRY: the values RTS must carry;
 * FAKE_IBV_PORTS: how many active ports the device has;
 * FAKE_IBV_DMABUF=unsupported: ibv_reg_dmabuf_mr fails with EOPNOTSUPP (a
 * kernel without dma-buf); built with -DFAKE_NO_DMABUF the symbol is absent
 * (an rdma-core older than 34).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#undef ibv_get_device_list
#undef ibv_free_device_list
#undef ibv_get_device_name
#undef ibv_open_device
#undef ibv_close_device
#undef ibv_query_device
#undef ibv_query_port
#undef ibv_query_gid
#undef ibv_alloc_pd
#undef ibv_dealloc_pd
#undef ibv_reg_mr
#undef ibv_dereg_mr
#undef ibv_create_cq
#undef ibv_destroy_cq
#undef ibv_create_qp
#undef ibv_modify_qp
#undef ibv_destroy_qp
#undef ibv_wc_status_str

#define MAXQ 1024
#define MAXMR 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct fcq {
  struct ibv_cq cq;
  struct ibv_wc wc[MAXQ];
  int head, tail;
};

struct item {
  uint64_t wr_id;
  uint64_t addr;
  uint32_t len, key, imm;
  int nsge;
  struct fqp* from;
};

struct fqp {
  struct ibv_qp qp;
  struct fcq* cq;
  int state;
  uint32_t dest;
  struct item recvs[MAXQ];
  int rh, rt;
  struct item sends[MAXQ]; /* arrived, waiting for a receive */
  int sh, st;
};

static struct fqp* qps[MAXQ];
static uint32_t next_qpn = 100, next_key = 7;
static struct { uint64_t addr, len; uint32_t key; int live; } mrs[MAXMR];
static struct ibv_device fakedev;
static struct ibv_device* list[2];

static int is_eth(void) {
  const char* l = getenv("FAKE_IBV_LINK");
  return l && !strcmp(l, "eth");
}

static int expect(const char* var, int dflt) {
  const char* v = getenv(var);
  return v ? atoi(v) : dflt;
}

/* FAKE_IBV_PORTS: active ports of the device (default 1). */
static int nports(void) { return expect("FAKE_IBV_PORTS", 1); }

static int covered(uint64_t addr, uint32_t len, uint32_t key) {
  for (int i = 0; i < MAXMR; i++)
    if (mrs[i].live && mrs[i].key == key && addr >= mrs[i].addr && addr + len <= mrs[i].addr + mrs[i].len)
      return 1;
  return 0;
}

static void push(struct fcq* c, uint64_t wr_id, int status, int opcode, uint32_t len, uint32_t imm, int flags) {
  struct ibv_wc* w = &c->wc[c->tail++ % MAXQ];
  memset(w, 0, sizeof(*w));
  w->wr_id = wr_id;
  w->status = status;
  w->opcode = opcode;
  w->byte_len = len;
  w->imm_data = imm;
  w->wc_flags = flags;
}

static struct fqp* find(uint32_t qpn) {
  for (int i = 0; i < MAXQ; i++)
    if (qps[i] && qps[i]->qp.qp_num == qpn) return qps[i];
  return NULL;
}

static void match(struct fqp* q) {
  while (q->rh != q->rt && q->sh != q->st) {
    struct item* r = &q->recvs[q->rh++ % MAXQ];
    struct item* s = &q->sends[q->sh++ % MAXQ];
    if (s->len > r->len) {
      push(q->cq, r->wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, 0);
      push(s->from->cq, s->wr_id, IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND, 0, 0, 0);
      continue;
    }
    if (s->len && !covered(r->addr, s->len, r->key)) {
      push(q->cq, r->wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0, 0);
      push(s->from->cq, s->wr_id, IBV_WC_REM_ACCESS_ERR, IBV_WC_SEND, 0, 0, 0);
      continue;
    }
    if (s->len) memcpy((void*)r->addr, (void*)s->addr, s->len);
    push(q->cq, r->wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, s->len, s->imm, IBV_WC_WITH_IMM);
    push(s->from->cq, s->wr_id, IBV_WC_SUCCESS, IBV_WC_SEND, s->len, 0, 0);
  }
}

static int f_poll(struct ibv_cq* cq, int n, struct ibv_wc* wc) {
  struct fcq* c = (struct fcq*)cq;
  pthread_mutex_lock(&mu);
  int k = 0;
  while (k < n && c->head != c->tail) wc[k++] = c->wc[c->head++ % MAXQ];
  pthread_mutex_unlock(&mu);
  return k;
}

static int f_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  struct fqp* q = (struct fqp*)qp;
  pthread_mutex_lock(&mu);
  for (; wr; wr = wr->next) {
    if (q->state < IBV_QPS_INIT || wr->num_sge > 1) {
      *bad = wr;
      pthread_mutex_unlock(&mu);
      return EINVAL;
    }
    struct item* r = &q->recvs[q->rt++ % MAXQ];
    memset(r, 0, sizeof(*r));
    r->wr_id = wr->wr_id;
    if (wr->num_sge) {
      r->addr = wr->sg_list[0].addr;
      r->len = wr->sg_list[0].length;
      r->key = wr->sg_list[0].lkey;
    }
  }
  match(q);
  pthread_mutex_unlock(&mu);
  return 0;
}

static int f_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  struct fqp* q = (struct fqp*)qp;
  pthread_mutex_lock(&mu);
  for (; wr; wr = wr->next) {
    struct fqp* d = find(q->dest);
    uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    uint64_t addr = wr->num_sge ? wr->sg_list[0].addr : 0;
    if (q->state != IBV_QPS_RTS || !d || wr->num_sge > 1 || !(wr->send_flags & IBV_SEND_SIGNALED)) {
      *bad = wr;
      pthread_mutex_unlock(&mu);
      return EINVAL;
    }
    if (len && !covered(addr, len, wr->sg_list[0].lkey)) {
      push(q->cq, wr->wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND, 0, 0, 0);
      continue;
    }
    if (wr->opcode == IBV_WR_RDMA_READ) {
      if (!covered(wr->wr.rdma.remote_addr, len, wr->wr.rdma.rkey)) {
        push(q->cq, wr->wr_id, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_READ, 0, 0, 0);
        continue;
      }
      memcpy((void*)addr, (void*)wr->wr.rdma.remote_addr, len);
      push(q->cq, wr->wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, len, 0, 0);
      continue;
    }
    if (wr->opcode != IBV_WR_SEND_WITH_IMM) {
      *bad = wr;
      pthread_mutex_unlock(&mu);
      return EINVAL;
    }
    struct item* s = &d->sends[d->st++ % MAXQ];
    s->wr_id = wr->wr_id;
    s->addr = addr;
    s->len = len;
    s->imm = wr->imm_data;
    s->from = q;
    match(d);
  }
  pthread_mutex_unlock(&mu);
  return 0;
}

struct ibv_device** ibv_get_device_list(int* n) {
  strcpy(fakedev.name, "fake0");
  list[0] = &fakedev;
  list[1] = NULL;
  if (n) *n = 1;
  return list;
}
void ibv_free_device_list(struct ibv_device** l) { (void)l; }
const char* ibv_get_device_name(struct ibv_device* d) { return d->name; }

struct ibv_context* ibv_open_device(struct ibv_device* d) {
  struct ibv_context* c = calloc(1, sizeof(*c));
  c->device = d;
  c->ops.poll_cq = f_poll;
  c->ops.post_send = f_post_send;
  c->ops.post_recv = f_post_recv;
  return c;
}
int ibv_close_device(struct ibv_context* c) {
  free(c);
  return 0;
}

int ibv_query_device(struct ibv_context* c, struct ibv_device_attr* a) {
  (void)c;
  memset(a, 0, sizeof(*a));
  a->phys_port_cnt = nports();
  a->max_qp = 4096;
  a->sys_image_guid = 0x1234;
  return 0;
}

/* The exported symbol takes the compat struct, a prefix of ibv_port_attr
 * that ends after link_layer/flags: what the plugin reads. */
int ibv_query_port(struct ibv_context* c, uint8_t port, struct _compat_ibv_port_attr* compat) {
  struct ibv_port_attr* a = (struct ibv_port_attr*)compat;
  (void)c;
  if (port < 1 || port > nports()) return EINVAL;
  memset(a, 0, offsetof(struct ibv_port_attr, port_cap_flags2));
  a->state = IBV_PORT_ACTIVE;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 2;
  a->lid = 3;
  a->active_speed = 32; /* EDR */
  a->active_width = 2;  /* 4x */
  a->link_layer = is_eth() ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int ibv_query_gid(struct ibv_context* c, uint8_t port, int index, union ibv_gid* gid) {
  (void)c;
  (void)port;
  memset(gid, 0, sizeof(*gid));
  if (index == 1) {
    gid->raw[10] = gid->raw[11] = 0xff;
    gid->raw[12] = 127;
    gid->raw[15] = 1;
  }
  return 0;
}

struct ibv_pd* ibv_alloc_pd(struct ibv_context* c) {
  struct ibv_pd* p = calloc(1, sizeof(*p));
  p->context = c;
  return p;
}
int ibv_dealloc_pd(struct ibv_pd* p) {
  free(p);
  return 0;
}

struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t len, int access) {
  (void)access;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXMR; i++) {
    if (mrs[i].live) continue;
    struct ibv_mr* m = calloc(1, sizeof(*m));
    m->context = pd->context;
    m->pd = pd;
    m->addr = addr;
    m->length = len;
    m->lkey = m->rkey = next_key++;
    mrs[i].addr = (uint64_t)addr;
    mrs[i].len = len;
    mrs[i].key = m->lkey;
    mrs[i].live = 1;
    pthread_mutex_unlock(&mu);
    return m;
  }
  pthread_mutex_unlock(&mu);
  errno = ENOMEM;
  return NULL;
}
int ibv_dereg_mr(struct ibv_mr* m) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXMR; i++)
    if (mrs[i].live && mrs[i].key == m->lkey) mrs[i].live = 0;
  pthread_mutex_unlock(&mu);
  free(m);
  return 0;
}

#ifndef FAKE_NO_DMABUF
/* Any open descriptor stands for a dma-buf, and the "NIC" reaches the
 * registered pages at their iova, which the tests make ordinary memory.
 * Each registration is logged so a test can check offset, length and iova. */
struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                                 int access) {
  const char* m = getenv("FAKE_IBV_DMABUF");
  if (m && !strcmp(m, "unsupported")) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  if (fd < 0 || fcntl(fd, F_GETFD) == -1) {
    errno = EBADF;
    return NULL;
  }
  fprintf(stderr, "fake: reg_dmabuf fd=%d offset=%llu len=%zu iova=0x%llx\n", fd, (unsigned long long)offset,
          len, (unsigned long long)iova);
  return ibv_reg_mr(pd, (void*)(uintptr_t)iova, len, access);
}
#endif

struct ibv_cq* ibv_create_cq(struct ibv_context* c, int cqe, void* ctx, struct ibv_comp_channel* ch, int vec) {
  (void)ctx;
  (void)ch;
  (void)vec;
  if (cqe <= 0 || cqe > MAXQ) {
    errno = EINVAL;
    return NULL;
  }
  struct fcq* q = calloc(1, sizeof(*q));
  q->cq.context = c;
  q->cq.cqe = cqe;
  return &q->cq;
}
int ibv_destroy_cq(struct ibv_cq* cq) {
  free(cq);
  return 0;
}

struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* a) {
  if (a->qp_type != IBV_QPT_RC || !a->send_cq || a->send_cq != a->recv_cq) {
    errno = EINVAL;
    return NULL;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXQ; i++) {
    if (qps[i]) continue;
    struct fqp* q = calloc(1, sizeof(*q));
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.qp_num = next_qpn++;
    q->qp.qp_type = IBV_QPT_RC;
    q->cq = (struct fcq*)a->send_cq;
    q->state = IBV_QPS_RESET;
    qps[i] = q;
    pthread_mutex_unlock(&mu);
    return &q->qp;
  }
  pthread_mutex_unlock(&mu);
  errno = ENOMEM;
  return NULL;
}

int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* a, int mask) {
  struct fqp* q = (struct fqp*)qp;
  int need;
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  switch (a->qp_state) {
    case IBV_QPS_INIT:
      need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      if (q->state != IBV_QPS_RESET || a->port_num < 1 || a->port_num > nports()) return EINVAL;
      break;
    case IBV_QPS_RTR:
      need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER;
      if (q->state != IBV_QPS_INIT) return EINVAL;
      if (is_eth() && (!a->ah_attr.is_global || a->ah_attr.grh.hop_limit == 0)) return EINVAL;
      if (!is_eth() && a->ah_attr.dlid != 3) return EINVAL;
      if (a->path_mtu != IBV_MTU_4096) return EINVAL;
      break;
    case IBV_QPS_RTS:
      need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
      if (q->state != IBV_QPS_RTR) return EINVAL;
      /* NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT must arrive (defaults 20 and 7). */
      if (a->timeout != expect("FAKE_IBV_EXPECT_TIMEOUT", 20) || a->retry_cnt != expect("FAKE_IBV_EXPECT_RETRY", 7) ||
          a->rnr_retry != 7)
        return EINVAL;
      break;
    default:
      return EINVAL;
  }
  if ((mask & need) != need) return EINVAL;
  pthread_mutex_lock(&mu);
  q->state = a->qp_state;
  if (a->qp_state == IBV_QPS_RTR) q->dest = a->dest_qp_num;
  pthread_mutex_unlock(&mu);
  return 0;
}

int ibv_destroy_qp(struct ibv_qp* qp) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXQ; i++)
    if (qps[i] == (struct fqp*)qp) qps[i] = NULL;
  pthread_mutex_unlock(&mu);
  free(qp);
  return 0;
}

const char* ibv_wc_status_str(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    default: return "other error";
  }
}
