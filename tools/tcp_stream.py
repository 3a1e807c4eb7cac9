"""A raw TCP stream between the two ranks of tools/netns_run.sh, as the
limit an oxccl figure over the same link is compared with:

  RATE=1gbit tools/netns_run.sh python3 tools/tcp_stream.py [MiB]

Rank 1 listens and counts; rank 0 sends MiB (128) in 1 MiB writes and
prints the rate once rank 1 has read everything (its shutdown ends it).
"""

import os
import socket
import sys
import time

PORT = 5599


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    if os.environ["RANK"] == "1":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", PORT))
        s.listen(1)
        c, _ = s.accept()
        while c.recv(1 << 20):
            pass
        c.close()
        return
    peer = os.environ["MASTER_ADDR"].rsplit(".", 1)[0] + ".2"
    for _ in range(50):
        try:
            s = socket.create_connection((peer, PORT))
            break
        except OSError:
            time.sleep(0.1)
    block = b"x" * (1 << 20)
    t = time.perf_counter()
    for _ in range(mib):
        s.sendall(block)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    dt = time.perf_counter() - t
    print(f"raw TCP {mib * (1 << 20) / dt / 1e6:.1f} MB/s ({mib} MiB in {dt:.3f} s)")


if __name__ == "__main__":
    main()
