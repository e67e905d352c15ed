"""Hosts with shaped links on one machine: a cluster file's host `emulation` (tfplace.formats.cluster).

    layout = host_layout(cluster, per="task")     # None when no host declares emulation
    check_available(layout)                       # before anything starts: root, ip, tc, the qdiscs
    with HostNetworks(layout) as net:             # in the run's private network (runtime.netns)
        net.address(i)        # "10.213.3.2": the address of process i's host
        net.preexec(i)        # preexec_fn of process i: into its host (network, /etc/hosts) before exec
        net.interface         # the NIC's name inside every host ("tfpllink")
        net.switch_address    # this process's address on the switch ("10.213.3.1")

Each emulated host is a network namespace of its own (`ip netns`), named
`tfplace-<pid>-<k>-h<i>`, whose only interfaces are `lo` and one end of a veth pair, `tfpllink`.
The other end (`tfpl<k>h<i>`) sits on a bridge, the switch, in the run's private namespace, where
the client (this process) holds `switch_address`. Both ends carry the host's NIC as a root qdisc:
the host end shapes what leaves the host (its NIC's up link), the switch end what enters it (the
down link), the two links the simulator puts on every path between hosts. A rate alone is a token
bucket (tc tbf); a delay is tc netem (with its `rate` when both are given). Processes of one host
share its namespace and talk over its loopback, unshaped, like tasks of one machine.

A process enters its host between fork and exec (`preexec`): it joins the host's network
namespace and, in a mount namespace of its own, sees the host's /etc/hosts (kept, as `ip netns
exec` keeps it, in /etc/netns/<namespace>/hosts), where this machine's name resolves to the
host's address, as each machine's name does on a real cluster. Gloo needs that: Horovod 0.28 binds
a process set's Gloo device to the address of the machine's name, not to HOROVOD_GLOO_IFACE.
(`ip netns exec` itself would also mount a fresh /sys, hiding the cgroup a rank checks its CPU
quota in.)

Everything lives inside the run's private network namespace (tfplace.runtime.netns, which the
caller enters first), which has no link to the machine's network: nothing here touches the
machine's interfaces, and `only_private` is the rule by which a namespace still counts as
private. The named namespaces are removed on `close()`; a run killed outright leaves its names in
/run/netns, which the next HostNetworks removes (their pid is gone).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import socket
import subprocess
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from tfplace.formats.errors import InputError, TfplaceError

if TYPE_CHECKING:  # not imported: runtime.netns imports this module before numpy may start threads
    from tfplace.formats.cluster import LinkEmulation

PREFIX = "tfpl"              # every interface made here starts so; all of them lead only to this run
INTERFACE = PREFIX + "link"  # the NIC inside each host
NETNS_DIR = "/run/netns"
ETC_NETNS_DIR = "/etc/netns"  # a host's own /etc/hosts: /etc/netns/<namespace>/hosts, where ip netns keeps it
NETNS_PREFIX = "tfplace-"
SUBNET_PREFIX = "10.213"     # 10.213.<k>.0/24: the k-th network of this process, inside its private namespace
QUEUE_LATENCY_S = 0.1        # tbf: how long a packet may wait for tokens before it is dropped
MIN_BURST_BYTES = 65536     # tbf's bucket: one 64 KiB GSO segment (tbf splits larger ones) ...
BURST_S = 1e-4              # ... or 100 us of the rate. A deeper bucket lets a message of that size pass
                            # unshaped: 500 kB (4 ms at 1 GbE) made the comm fit read 5.3 GB/s on a 125 MB/s link
NETEM_LIMIT_PACKETS = 10000
_CLONE_NEWNET, _CLONE_NEWNS = 0x40000000, 0x00020000
_MS_BIND, _MS_REC, _MS_SLAVE = 4096, 16384, 1 << 19

FIX_ROOT = "run as root (network namespaces and tc need CAP_NET_ADMIN), or remove the hosts' emulation"
FIX_IPROUTE = "install iproute2 (apt-get install iproute2: `ip` and `tc`), or remove the hosts' emulation"


def only_private(interface_names: Sequence[str]) -> bool:
    """Whether a namespace with these interfaces reaches nothing beyond this run: loopback, and the
    emulated hosts' links made here (which lead only to this run's namespaces)."""
    return all(name == "lo" or name.startswith(PREFIX) for name in interface_names)


class LinkEmulationError(TfplaceError, RuntimeError):
    """Setting up an emulated host's namespace or qdisc failed (the message holds the command)."""


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Which emulated host each process (a TF task, a Horovod rank) runs on.

    hosts: host names, in the cluster file's order; links[h]: host h's emulation;
    fields[h]: its field in the file ("hosts[1].emulation"), for errors;
    host_of_process[i]: index into hosts of process i; source: the cluster file."""
    hosts: Tuple[str, ...]
    links: Tuple[LinkEmulation, ...]
    fields: Tuple[str, ...]
    host_of_process: Tuple[int, ...]
    source: str


def host_layout(cluster, per: str = "task") -> Optional[HostLayout]:
    """The layout of `cluster`'s processes over its emulated hosts: one process per TF task
    (per="task") or per device (per="device", the Horovod ranks); None when no host declares
    emulation (the file allows all hosts or none)."""
    if not any(h.emulation is not None for h in cluster.hosts):
        return None
    index = {h.name: i for i, h in enumerate(cluster.hosts)}
    if per == "task":
        host_of = [0] * cluster.num_tasks
        for d in cluster.devices:
            host_of[d.task] = index[d.host]
    elif per == "device":
        host_of = [index[d.host] for d in cluster.devices]
    else:
        raise ValueError(f"per must be 'task' or 'device', got {per!r}")
    return HostLayout(hosts=tuple(h.name for h in cluster.hosts), links=tuple(h.emulation for h in cluster.hosts),
                      fields=tuple(f"hosts[{i}].emulation" for i in range(len(cluster.hosts))),
                      host_of_process=tuple(host_of), source=cluster.source or cluster.name)


def qdisc_args(link: LinkEmulation) -> List[str]:
    """The root qdisc (after `tc qdisc add dev D root`) that emulates one direction of `link`."""
    rate = [] if link.bandwidth_bytes_per_s is None else ["rate", f"{int(round(link.bandwidth_bytes_per_s * 8))}bit"]
    if link.latency_s:
        return ["netem", "delay", f"{int(round(link.latency_s * 1e6))}us"] + rate + ["limit", str(NETEM_LIMIT_PACKETS)]
    if link.bandwidth_bytes_per_s is None:
        return ["pfifo"]  # latency_s 0: nothing to add
    burst = max(MIN_BURST_BYTES, int(link.bandwidth_bytes_per_s * BURST_S))
    return ["tbf"] + rate + ["burst", str(burst), "latency", f"{int(QUEUE_LATENCY_S * 1e3)}ms"]


_probed: Dict[str, bool] = {}


def _qdisc_works(args: Sequence[str]) -> bool:
    """Whether this kernel accepts the qdisc `args` on a veth (tried in a throwaway namespace)."""
    kind = args[0]
    if kind not in _probed:
        script = ("ip link add tfplprobe type veth peer name tfplprobe1 && "
                  f"tc qdisc add dev tfplprobe root {' '.join(args)}")
        done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True)
        _probed[kind] = done.returncode == 0
    return _probed[kind]


def check_available(layout: Optional[HostLayout]) -> None:
    """Raises InputError naming the cluster file and `hosts[i].emulation...` when this machine cannot
    emulate `layout`'s links: not root, no `ip`/`tc`/`unshare`, or a qdisc the kernel lacks. Starts
    nothing and leaves nothing behind."""
    if layout is None:
        return
    first = layout.fields[0]
    if os.geteuid() != 0:
        raise InputError(layout.source, first, "emulated hosts need root (network namespaces and tc)", FIX_ROOT)
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise InputError(layout.source, first, f"emulated hosts need `{tool}`, which is not on PATH", FIX_IPROUTE)
    for link, field in zip(layout.links, layout.fields):
        args = qdisc_args(link)
        if not _qdisc_works(args):
            key = "latency_s" if args[0] == "netem" else "bandwidth_bytes_per_s"
            fix = ("load the kernel's netem qdisc (modprobe sch_netem), or leave latency_s out and shape the "
                   "bandwidth only (tc tbf)" if key == "latency_s" else
                   "load the kernel's token bucket qdisc (modprobe sch_tbf), or remove the hosts' emulation")
            raise InputError(layout.source, f"{field}.{key}", f"this kernel has no tc {args[0]} qdisc", fix)


def checked_layout(cluster, per: str = "task") -> Optional[HostLayout]:
    """`host_layout(cluster, per)` once `check_available` has found this machine able to emulate
    it (InputError naming the file and field otherwise); None when no host declares emulation."""
    layout = host_layout(cluster, per)
    check_available(layout)
    return layout


def _run(cmd: Sequence[str]) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        raise LinkEmulationError(f"tfplace: link emulation: `{' '.join(cmd)}` failed: {done.stderr.strip()}")


def remove_stale_namespaces() -> List[str]:
    """Removes the namespaces of runs whose process is gone (killed before `close`); returns their names."""
    from tfplace.emulation.cpu_quota import pid_alive  # here: runtime.netns imports this module before numpy
    removed = []
    for name in sorted(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else ():
        parts = name[len(NETNS_PREFIX):].split("-")
        if name.startswith(NETNS_PREFIX) and parts[0].isdigit() and not pid_alive(int(parts[0])):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(os.path.join(ETC_NETNS_DIR, name), ignore_errors=True)
            removed.append(name)
    return removed


_networks_made = 0  # k of the next HostNetworks of this process (its subnet and names)


class HostNetworks:
    """The emulated hosts of a HostLayout, made in the calling thread's network namespace, which
    must be the run's private one (tfplace.runtime.netns.ensure_private_network first), and removed
    on `close()`. Raises InputError (check_available, or a namespace that is not private) or
    LinkEmulationError before any process starts; what was made is removed."""

    def __init__(self, layout: HostLayout):
        global _networks_made
        check_available(layout)
        if not only_private([name for _, name in socket.if_nameindex()]):  # the machine's own network
            raise InputError(layout.source, layout.fields[0], "emulated hosts are made inside the run's private "
                             "network, and this process runs in the machine's (TFPLACE_ALLOW_OPEN_PORTS=1?)",
                             "unset TFPLACE_ALLOW_OPEN_PORTS, or remove the hosts' emulation")
        remove_stale_namespaces()
        self.layout = layout
        self.k = _networks_made % 250
        _networks_made += 1
        self.bridge = f"{PREFIX}br{self.k}"
        self.switch_address = f"{SUBNET_PREFIX}.{self.k}.1"
        self.interface = INTERFACE
        self._names: List[str] = []
        self._fds: List[int] = []
        self._bridge_made = False
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def host_address(self, host: int) -> str:
        return f"{SUBNET_PREFIX}.{self.k}.{host + 2}"

    def address(self, process: int) -> str:
        """The address of process `process`'s host (what its server is reached at)."""
        return self.host_address(self.layout.host_of_process[process])

    def namespace(self, host: int) -> str:
        return f"{NETNS_PREFIX}{os.getpid()}-{self.k}-h{host}"

    def _port(self, host: int) -> str:
        """The switch's end of host `host`'s link."""
        return f"{PREFIX}{self.k}h{host}"

    def _make(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_made = True
        _run(["ip", "addr", "add", f"{self.switch_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for h, link in enumerate(self.layout.links):
            ns, port = self.namespace(h), self._port(h)
            _run(["ip", "netns", "add", ns])
            self._names.append(ns)
            etc = os.path.join(ETC_NETNS_DIR, ns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:  # this machine's name is the host's address there
                f.write(f"127.0.0.1 localhost\n::1 localhost\n{self.host_address(h)} {socket.gethostname()}\n")
            _run(["ip", "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", ns])
            _run(["ip", "link", "set", port, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.host_address(h)}/24", "dev", INTERFACE])
            _run(["ip", "-n", ns, "link", "set", INTERFACE, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            qdisc = qdisc_args(link)
            _run(["tc", "qdisc", "add", "dev", port, "root"] + qdisc)             # into the host: its down link
            _run(["tc", "-n", ns, "qdisc", "add", "dev", INTERFACE, "root"] + qdisc)  # out of it: its up link
            self._fds.append(os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY | os.O_CLOEXEC))

    def preexec(self, process: int) -> Callable[[], None]:
        """preexec_fn of process `process`: joins its host's network namespace, then binds the
        host's /etc/hosts over /etc/hosts in a mount namespace of its own (changes below / reach
        it, its own reach nothing else). Everything is looked up here: the child only calls libc."""
        host = self.layout.host_of_process[process]
        fd, hosts_file = self._fds[host], os.path.join(ETC_NETNS_DIR, self.namespace(host), "hosts").encode()
        libc = ctypes.CDLL(None, use_errno=True)
        setns, unshare, mount = libc.setns, libc.unshare, libc.mount
        mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]

        def check(result: int, what: str) -> None:
            if result != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"entering emulated host {host}: {what}: {os.strerror(err)}")

        def enter():
            check(setns(fd, _CLONE_NEWNET), "setns")
            check(unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            check(mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
            check(mount(hosts_file, b"/etc/hosts", None, _MS_BIND, None), "bind /etc/hosts")
        return enter

    def close(self) -> None:
        """Removes the hosts' namespaces (their veths go with them) and the switch (idempotent)."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        for h, ns in enumerate(self._names):  # a veth goes with either end, at once (a namespace's go later)
            subprocess.run(["ip", "link", "del", self._port(h)], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(os.path.join(ETC_NETNS_DIR, ns), ignore_errors=True)
        if self._names:
            try:
                os.rmdir(ETC_NETNS_DIR)  # when no other namespace keeps files there
            except OSError:
                pass
        self._names = []
        if self._bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._bridge_made = False

    def __enter__(self) -> "HostNetworks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chain(*steps: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """One preexec_fn that runs each of `steps` (None ones skipped) in order; None when all are None."""
    todo = [step for step in steps if step is not None]
    if not todo:
        return None

    def run_all():
        for step in todo:
            step()
    return run_all
