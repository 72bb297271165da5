"""Candidates that reach the runner's own descriptors from native code: the reply pipe (found as the one
write-only pipe past stderr) and the shared exchange (found as the one descriptor that answers ``F_GET_SEALS``).
One extension serves every attack of ``test_reply_fuzz`` and ``test_exchange_leaks`` (built once): what each
does is chosen by the Python part, which passes the bytes to write and when to write them.

``strike(payload, then)`` writes ``payload`` to the reply pipe, then ``_exit``s (``then`` = 0), sleeps
forever (1) or goes on (2); ``leaky(x)`` is the honest kernel; ``leave(marker)`` grows the exchange by a page where it can and
writes ``marker`` past its end (else at its last bytes); ``find(marker)`` says whether the exchange holds it;
``grow(bytes)`` tries to make the exchange that large, and says whether it could; ``leaky_or_zeros(x, signal)``
is the honest output, or zeros when ``signal`` is set (how a verdict shows what a candidate found).
"""
from __future__ import annotations

import textwrap

from tests.adversarial.attacks import PROBLEM, candidate

CHANNEL_KERNEL = r"""
#include <string>
#include <sys/stat.h>
#include <unistd.h>

// <fcntl.h> is refused by the native rules; the function itself is not
extern "C" int fcntl(int fd, int cmd, ...);
static const int kGetFlags = 3, kAccessMode = 3, kWriteOnly = 1, kGetSeals = 1034;

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}

static int reply_fd() {
    for (int fd = 3; fd < 1024; ++fd) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
        int fl = fcntl(fd, kGetFlags);
        if (fl >= 0 && (fl & kAccessMode) == kWriteOnly) return fd;
    }
    return -1;
}

static int exchange_fd() {
    for (int fd = 3; fd < 1024; ++fd)
        if (fcntl(fd, kGetSeals) >= 0) return fd;
    return -1;
}

int64_t strike(std::string payload, int64_t then) {
    int fd = reply_fd();
    size_t off = 0;
    while (fd >= 0 && off < payload.size()) {
        ssize_t n = write(fd, payload.data() + off, payload.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
    }
    if (then == 0) _exit(0);
    while (then == 1) sleep(1000);
    return fd;
}

int64_t leave(std::string marker) {
    int fd = exchange_fd();
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return -1;
    off_t pos = st.st_size;
    if (ftruncate(fd, st.st_size + 4096) != 0) pos = st.st_size - static_cast<off_t>(marker.size());
    return pwrite(fd, marker.data(), marker.size(), pos) == static_cast<ssize_t>(marker.size()) ? 1 : 0;
}

int64_t find(std::string marker) {
    int fd = exchange_fd();
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return FIND_MAPPED;
    std::string buf(1 << 20, '\0');
    for (off_t pos = 0; pos < st.st_size; pos += static_cast<off_t>(buf.size() - marker.size())) {
        ssize_t n = pread(fd, &buf[0], buf.size(), pos);
        if (n <= 0) break;
        if (std::string(buf.data(), static_cast<size_t>(n)).find(marker) != std::string::npos) return 1;
    }
    return 0;
}

int64_t grow(int64_t bytes) {
    int fd = exchange_fd();
    return fd >= 0 && ftruncate(fd, bytes) == 0 ? 1 : 0;
}

// the honest output, or zeros when `signal` is nonzero: how a candidate's verdict shows what it found
torch::Tensor leaky_or_zeros(torch::Tensor x, int64_t signal) {
    auto out = leaky(x);
    if (signal) {
        float* o = out.data_ptr<float>();
        for (int64_t i = 0; i < out.numel(); ++i) o[i] = 0.f;
    }
    return out;
}
"""

FUNCTIONS = ("leaky", "strike", "leave", "find", "grow", "leaky_or_zeros")

# With ``read_maps``: where the runner has no descriptor of the exchange left (it closes them before candidate code
# loads), ``find`` searches the exchange's mapping, found through /proc/self/maps (file access the static rules
# refuse: a test that uses it switches them off).
MAPS_READER = r"""
#include <cstdio>
#include <cstring>
// the runner closes its descriptors of the exchange before candidate code loads; its mapping stays: search it
static int64_t find_mapped(const std::string& marker) {
    FILE* maps = fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[512];
    int64_t found = 0;
    while (!found && fgets(line, sizeof line, maps)) {
        if (!strstr(line, "memfd:")) continue;
        unsigned long lo = 0, hi = 0;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || !strstr(line, " r")) continue;
        std::string view(reinterpret_cast<const char*>(lo), hi - lo);
        found = view.find(marker) != std::string::npos;
    }
    fclose(maps);
    return found;
}

"""


def channel_candidate(*, prelude: str = "", init: str = "", forward: str = "return ext.leaky(x)",
                      read_maps: bool = False) -> str:
    """A candidate on ``CHANNEL_KERNEL``: ``prelude`` is module-level code, ``init`` runs in ``ModelNew.__init__``
    (the load phase), ``forward`` is the call."""
    kernel = (MAPS_READER + CHANNEL_KERNEL.replace("FIND_MAPPED", "find_mapped(marker)")) if read_maps else \
        CHANNEL_KERNEL.replace("FIND_MAPPED", "0")
    source = candidate(kernel, name="adv_runner_channel_maps" if read_maps else "adv_runner_channel",
                       functions=FUNCTIONS, forward=forward, prelude=prelude)
    if init:
        source = source.replace("        super().__init__()\n",
                                "        super().__init__()\n" + textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8)
                                + "\n", 1)
    return source


__all__ = ["CHANNEL_KERNEL", "PROBLEM", "channel_candidate"]
