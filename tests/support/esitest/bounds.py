"""The memory bounds docs/operate.md states (Slow clients and a full disk), as the tests
and the benchmarks check them; every figure in KiB."""

# esid: a fixed overhead (code, libraries, heap); per worker connection its
# memfd (4 KiB and two rings) and its queue of answers (kMaxPendingAnswers
# 256 of at most kSpliceBudgetBytes 32 KiB); per open stream the tag its
# parser may hold (maxTagBytes 8 KiB, in a string whose capacity may
# double) and the stream itself (its uri, its authority, about 2 KiB of
# objects); plus what its zones hold (plan zones: plans and segments).
ESID_FIXED_KIB = 16 * 1024
ESID_STREAM_KIB = 2 * 8 + 2


def esid_connection_kib(ring_bytes=1 << 20):
    return (4096 + 2 * ring_bytes) // 1024 + 256 * 32


def esid_bound_kib(connections, streams, ring_bytes=1 << 20, zone_bytes=0):
    return (ESID_FIXED_KIB + connections * esid_connection_kib(ring_bytes)
            + streams * ESID_STREAM_KIB + zone_bytes // 1024)


# An NGINX worker: a fixed overhead (16 MiB: code, libraries, its pools,
# the keys_zone pages it touched, the up to 8 deflate streams of 144 KiB
# the stitch filter keeps between responses), the rings of its connection
# to esid and the segment arena's pages it has sent (shared memory, counted
# in its VmRSS once touched); and per client whose answer is under way, however
# slowly it reads: the page read ahead from the cache file (output_buffers,
# 2 x 32 KiB), the buffers of a fragment being fetched (proxy_buffer_size
# and proxy_buffers, 9 x 4 KiB) and the request's pools and contexts
# (16 KiB); for a gzip client, on top, a deflate stream and its output
# buffers: the stitch filter's (windowBits 15, memLevel 5: 144 KiB, and
# 8 x 16 KiB) or the gzip filter's (memLevel 8: 280 KiB, and gzip_buffers
# 32 x 4 KiB), the larger one counted.
WORKER_FIXED_KIB = 16 * 1024
CLIENT_KIB = 2 * 32 + 9 * 4 + 16
GZIP_CLIENT_KIB = CLIENT_KIB + 280 + 32 * 4


def worker_bound_kib(plain_clients, gzip_clients, workers,
                     ring_bytes=1 << 20, arena_used_bytes=0):
    """The workers' VmRSS together."""
    return (workers * (WORKER_FIXED_KIB + 2 * ring_bytes // 1024
                       + arena_used_bytes // 1024)
            + plain_clients * CLIENT_KIB + gzip_clients * GZIP_CLIENT_KIB)
