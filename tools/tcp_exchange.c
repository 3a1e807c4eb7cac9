/* The kernel's floor for an 8-byte all-reduce of two processes over loopback TCP: each side
 * sends its 8 bytes and then busy-polls for the peer's (TCP_NODELAY, MSG_DONTWAIT), which is one
 * exchange, what oxccl's socket net and OpenMPI's TCP transport both do at 2 ranks. By default on
 * one connection carrying both directions (as OpenMPI's TCP transport); with "oneway", on two
 * connections each carrying one direction, the shape NCCL's net ABI gives (a send and a receive
 * comm per peer), where every message also costs a bare ACK.
 * Usage: tcp_exchange [iters [warm-up [oneway]]]; prints the mean time of one exchange in us. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  int warm = argc > 2 ? atoi(argv[2]) : iters / 10;
  int oneway = argc > 3 && argv[3][0] == 'o';
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
  pid_t child = fork();
  if (child < 0) die("fork");
  /* Two connections: the child's first and the parent's second are the send sides. */
  int conn[2];
  for (int k = 0; k < 1 + oneway; k++) {
    if (child == 0) {
      conn[k] = socket(AF_INET, SOCK_STREAM, 0);
      if (conn[k] < 0 || connect(conn[k], (void *)&a, sizeof a)) die("connect");
    } else if ((conn[k] = accept(ls, 0, 0)) < 0) {
      die("accept");
    }
  }
  int out = conn[0], in = conn[0];
  if (oneway) {
    out = conn[child == 0 ? 0 : 1];
    in = conn[child == 0 ? 1 : 0];
  }
  int one = 1;
  setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char b[8] = {0};
  double t0 = now();
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = now();
    if (send(out, b, sizeof b, 0) != sizeof b) die("send");
    for (size_t got = 0; got < sizeof b;) {
      ssize_t r = recv(in, b + got, sizeof b - got, MSG_DONTWAIT);
      if (r > 0) got += r;
      else if (r == 0 || errno != EAGAIN) die("recv");
    }
  }
  double us = (now() - t0) / iters * 1e6;
  if (child) {
    printf("8 B exchange over loopback TCP, %s, %d iterations: %.2f us\n",
           oneway ? "a connection each way" : "one connection", iters, us);
    waitpid(child, 0, 0);
  }
  return 0;
}
