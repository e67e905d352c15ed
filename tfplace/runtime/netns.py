"""A private network namespace for local runs: their servers are reachable through loopback only.

TensorFlow's gRPC server binds every interface (`0.0.0.0` and `[::]`), whatever address its
cluster spec gives, and has no option to bind one address; Horovod's Gloo and rendezvous
listeners are started by code we do not own either. So a local run (a LocalCluster, the Horovod
baselines) goes into a network namespace of its own whose only interface is `lo`: a server
that binds the wildcard there accepts connections from this run's processes, over loopback,
and from nothing else on the machine or the network. A cluster's emulated hosts
(tfplace.emulation.links) add a switch and veth links there that lead only to the run's own
host namespaces; the namespace still counts as private (`links.only_private`).

    from tfplace.runtime import netns
    netns.enter_private_network()     # at the start of a script, before TensorFlow opens a channel
    netns.ensure_private_network("a local cluster")   # what LocalCluster.start() calls

Linux namespaces belong to threads, and a process's children inherit the namespace of the thread
that started them. `enter_private_network` moves the calling (main) thread; the servers it then
starts and the gRPC threads TensorFlow starts later follow it. Once gRPC runs its own threads
(after the first session or server in this process) they stay where they are, so entering then
would cut this process off from its own servers: `ensure_private_network` refuses that with the
fix instead. The command lines that start servers (activate, overheads) enter at start-up.

Root enters with CLONE_NEWNET; other users with CLONE_NEWUSER|CLONE_NEWNET (unprivileged user
namespaces; the process must then still be single-threaded, i.e. enter before TensorFlow or
numpy is imported). Where neither is allowed, a run stops with the fix; setting
`TFPLACE_ALLOW_OPEN_PORTS=1` accepts servers on every interface (with a warning).

`non_loopback_listeners(pid)` says which listening sockets of a process accept connections on an
address that is not loopback (how the tests check a run).
"""

from __future__ import annotations

import ctypes
import fcntl
import glob
import ipaddress
import os
import socket
import struct
import sys
import threading
from typing import List, Optional, Tuple

from tfplace.emulation.links import only_private  # loopback and the emulated hosts' links
from tfplace.formats.errors import TfplaceError

ALLOW_OPEN_PORTS_ENV = "TFPLACE_ALLOW_OPEN_PORTS"

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sh22x"  # struct ifreq: the interface name, then the flags (of a 40-byte union)
# Thread names (/proc/self/task/*/comm, cut to 15 characters) of gRPC's own threads: once one
# exists, channels of this process are made in the namespace gRPC started in.
_GRPC_THREADS = ("grpc", "default-executo", "resolver-execut")
_TCP_LISTEN = "0A"

_original_fd: Optional[int] = None  # the namespace this process started in, once it has left it
_warned_open = False


class NetworkIsolationError(TfplaceError, RuntimeError):
    """A local run cannot be confined to loopback (see the module docstring for the fixes)."""


def interfaces() -> List[str]:
    """Names of the network interfaces of the calling thread's namespace."""
    return [name for _, name in socket.if_nameindex()]


def in_private_network() -> bool:
    """True when the calling thread's namespace has no interface but loopback and emulated links."""
    return only_private(interfaces())


def grpc_started() -> bool:
    """True when gRPC's threads run in this process (a TF session or server was made)."""
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path) as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(_GRPC_THREADS):
            return True
    return False


def _loopback_up() -> None:
    """Sets `lo` up (a new namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _libc(call: str, *args: int) -> None:
    """Calls libc's `call(*args)`; raises OSError with its errno when it returns non-zero."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, call)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enter_private_network() -> None:
    """Moves the calling thread into a new network namespace with loopback up (no-op when its
    namespace is already private). Raises NetworkIsolationError when the system forbids it."""
    global _original_fd
    if in_private_network():
        return
    if threading.current_thread() is not threading.main_thread():
        raise NetworkIsolationError("tfplace: a private network must be entered from the main thread "
                                    "(its children and later threads follow it). Fix: call "
                                    "tfplace.runtime.netns.enter_private_network() at the start of the script")
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.geteuid() == 0:
            _libc("unshare", _CLONE_NEWNET)
        else:  # an unprivileged user namespace that maps this user to itself
            uid, gid = os.geteuid(), os.getegid()
            _libc("unshare", _CLONE_NEWUSER | _CLONE_NEWNET)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as err:
        os.close(original)
        raise NetworkIsolationError(
            f"tfplace: cannot make a private network namespace for the local servers ({err}); TensorFlow's "
            "servers would listen on every interface of this machine, without authentication. Fix: run as "
            "root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
            "user.max_user_namespaces > 0) and enter before TensorFlow or numpy start threads, or set "
            f"{ALLOW_OPEN_PORTS_ENV}=1 to accept servers on every interface") from err
    if _original_fd is None:
        _original_fd = original
    else:
        os.close(original)


def ensure_private_network(what: str) -> None:
    """Called before `what` (e.g. "a local cluster") starts servers: enters a private network when
    that is still possible; raises NetworkIsolationError with the fix when it is not (gRPC already
    runs threads in the machine's namespace). `TFPLACE_ALLOW_OPEN_PORTS=1` skips it, warning once."""
    global _warned_open
    if in_private_network():
        return
    if os.environ.get(ALLOW_OPEN_PORTS_ENV) == "1":
        if not _warned_open:
            print(f"warning: {ALLOW_OPEN_PORTS_ENV}=1: {what} listens on every interface of this machine",
                  file=sys.stderr)
            _warned_open = True
        return
    if grpc_started() or threading.current_thread() is not threading.main_thread():
        raise NetworkIsolationError(
            f"tfplace: {what} would listen on every interface: this process already runs TensorFlow's gRPC "
            "threads outside a private network. Fix: call tfplace.runtime.netns.enter_private_network() at "
            "the start of the script, before the first TensorFlow session or server (the tfplace commands do), "
            f"or set {ALLOW_OPEN_PORTS_ENV}=1 to accept servers on every interface")
    enter_private_network()


def original_namespace_fd() -> Optional[int]:
    """A file descriptor of the namespace this process started in, once it has entered a private
    one (None before): what a test joins (setns) to look at the run from the machine's side."""
    return _original_fd


def join_namespace(fd: int) -> None:
    """Moves the calling thread into the network namespace `fd` (setns; needs privilege)."""
    _libc("setns", fd, _CLONE_NEWNET)


# ------------------------------------------------------------------------------- inspection

def _socket_inodes(pid: int) -> set:
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> Tuple[ipaddress._BaseAddress, int]:
    """A /proc/net/tcp{,6} `local_address` (host-order 32-bit words in hex, then the port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words), int(port, 16)


def _interfaces_of(pid: int) -> List[str]:
    """Interface names of the network namespace of process `pid` (/proc/PID/net/dev)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return [line.split(":")[0].strip() for line in f.readlines()[2:] if ":" in line]


def listeners(pid: int) -> List[Tuple[str, bool]]:
    """The listening TCP sockets of process `pid`, as ("address:port", reachable beyond loopback):
    reachable when bound to anything but loopback in a namespace that has an interface besides
    `lo` and emulated links (`only_private`). Empty for a process that has ended."""
    try:
        inodes = _socket_inodes(pid)
        private = only_private(_interfaces_of(pid))
        rows = []
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                rows += [line.split() for line in f.readlines()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        return []
    found = []
    for row in rows:
        if row[3] != _TCP_LISTEN or row[9] not in inodes:
            continue
        address, port = _address(row[1])
        address = getattr(address, "ipv4_mapped", None) or address
        beyond = not (address.is_loopback or private)  # a private namespace leads nowhere else
        found.append((f"{address}:{port}", beyond))
    return found


def non_loopback_listeners(pid: int) -> List[str]:
    """The listening sockets of `pid` that accept connections from beyond loopback (`listeners`)."""
    return [address for address, beyond in listeners(pid) if beyond]
