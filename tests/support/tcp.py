"""What Linux counted on a TCP socket."""

import socket
import struct

# struct tcp_info (linux/tcp.h): 8 one-byte fields, 24 u32 (rto ... total_retrans), 4 u64
# (pacing_rate ... bytes_received), then u32 segs_out, segs_in, notsent_bytes, min_rtt,
# data_segs_in.
_DATA_SEGS_IN = 8 + 24 * 4 + 4 * 8 + 4 * 4


def data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, _DATA_SEGS_IN)[0])
