"""Confining a worker process: what it does to itself before the implementation loads.

A worker runs code fuseval does not trust (an implementation under test, a problem
folder's reference). :func:`enter` is the first thing a worker does, in its main thread,
before torch starts a thread of its own, so that every thread and child process it ever
has inherits all of this:

1. **its own session** (``setsid``): fuseval finds every process the worker starts by its
   session id, and the seccomp filter below keeps them in it;
2. **no capabilities** (when it runs as root): the bounding, ambient, effective,
   permitted and inheritable sets emptied, so that root's powers (reading kernel memory
   through /proc/kcore, signalling any process, loading modules) are gone, and no
   ``execve`` brings them back; ``no_new_privs`` set;
3. **a seccomp filter** (libseccomp, through the ``pyseccomp`` binding): ``ptrace`` and
   ``process_vm_readv/writev`` refused; signals only to the worker's own pid (``kill``,
   ``tgkill``, ``rt_sigqueueinfo``; ``tkill`` and the pidfd calls refused); no new session
   or process group; no terminal injection (``TIOCSTI``, ``TIOCLINUX``); no
   ``PR_SET_DUMPABLE`` (which would hide the worker's memory map from fuseval); no new
   namespaces, mounts, kernel modules, BPF programs or perf events; no IPv4, IPv6 or raw
   sockets (so no network, UDP included, whatever Landlock's ABI covers);
4. **a Landlock domain** (the ``landlockpy`` binding): files may be read and executed
   everywhere but written only in the worker's scratch folder, the compiler-cache folder,
   ``/dev/shm`` (CUDA IPC's reference counts live there) and a few device files (the
   GPU's, ``/dev/null``...), and, for a GPU worker, the files of its own ``/proc/<pid>``
   folder (the CUDA driver writes there); no TCP bind or connect; signals and abstract UNIX sockets
   scoped to the domain; and, as Landlock always does, no ptrace of (nor reading the
   memory or file descriptors of) a process outside it;
5. the scratch folder as working folder and ``TMPDIR``; compiler caches (Triton, CUDA,
   inductor) in the cache folder; no bytecode written; no core files; the first process
   the out-of-memory killer picks.

Each mechanism is applied where the machine offers it (:func:`probe` says which); what is
missing is reported once by fuseval's process and shown in every report. ``docs/security.md``
states what this defends and what it does not.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import resource
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping
from ..errors import ResourceLimitError

__all__ = ["Plan", "Applied", "probe", "enter", "MECHANISMS", "confinement", "ConfinementWarning", "warn_missing",
           "ensure_open_files", "cache_folder", "MIN_OPEN_FILES"]

# every mechanism by name, in the order enter() applies them
MECHANISMS = ("session", "capabilities", "seccomp", "landlock")

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                     0x40000000)   # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

# refused outright: reading or writing another process, leaving the session, and the
# administrative calls no kernel needs (each is also denied by the missing capabilities
# where the worker ran as root; the filter holds for any user)
_REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "tkill", "pidfd_open", "pidfd_send_signal",
            "pidfd_getfd", "setsid", "setpgid", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
            "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "mount_setattr", "init_module",
            "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "iopl",
            "ioperm", "userfaultfd", "open_by_handle_at", "kcmp", "process_madvise", "process_mrelease",
            "keyctl", "add_key", "request_key", "reboot", "swapon", "swapoff", "acct", "settimeofday",
            "clock_settime", "clock_adjtime", "adjtimex", "syslog", "vhangup", "quotactl")

# device files a worker may open for writing (GPU drivers, the bit buckets)
_DEVICE_GLOBS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/nvidia*",
                 "/dev/nvidia-caps/*", "/dev/dxg")


@dataclass(frozen=True)
class Plan:
    """Where a worker may write: ``scratch`` (its own folder, removed when it ends) and
    ``cache`` (compiler caches shared by fuseval's workers)."""
    scratch: str
    cache: str
    gpu: bool = False       # the worker drives a GPU: the driver writes files of its own process


@dataclass
class Applied:
    """What :func:`enter` applied, and why each missing mechanism is missing."""
    session: bool = False
    capabilities: bool = False
    seccomp: bool = False
    landlock_abi: int = 0
    missing: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def names(self) -> list[str]:
        on = {"session": self.session, "capabilities": self.capabilities, "seccomp": self.seccomp,
              "landlock": self.landlock_abi > 0}
        return [m for m in MECHANISMS if on[m]]

    def describe(self) -> str:
        parts = []
        if self.session:
            parts.append("own session")
        if self.capabilities:
            parts.append("no capabilities")
        if self.seccomp:
            parts.append("seccomp")
        if self.landlock_abi:
            parts.append(f"Landlock ABI {self.landlock_abi}")
        text = "confined (" + ", ".join(parts) + ")" if parts else "not confined"
        if self.missing:
            text += "; without " + "; ".join(f"{k}: {v}" for k, v in self.missing.items())
        return text


# --------------------------------------------------------------------------- what the machine offers
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _landlock_abi() -> tuple[int, str]:
    if not sys.platform.startswith("linux"):
        return 0, f"not Linux ({sys.platform})"
    try:
        import landlockpy
    except ImportError as exc:
        return 0, f"the landlockpy package is not installed ({exc})"
    try:
        abi = int(landlockpy.abi_version())
    except Exception as exc:  # noqa: BLE001 - any failure of the probe means: not available
        return 0, f"the Landlock probe failed ({type(exc).__name__}: {exc})"
    return (abi, "") if abi > 0 else (0, "the kernel has no Landlock (too old, or not in its LSM list)")


def _seccomp_module():
    """libseccomp's Python binding: the official ``seccomp`` module where the system has it,
    else ``pyseccomp`` (the same API through ctypes)."""
    try:
        import seccomp  # type: ignore[import-not-found]
        return seccomp, ""
    except ImportError:
        pass
    try:
        import pyseccomp
        return pyseccomp, ""
    except ImportError as exc:
        return None, f"no libseccomp binding (pip install pyseccomp: {exc})"
    except OSError as exc:
        return None, f"libseccomp is not on this machine ({exc})"


def probe() -> Applied:
    """What :func:`enter` would apply on this machine, as seen from fuseval's process."""
    found = Applied()
    if not sys.platform.startswith("linux"):
        found.missing = {m: f"not Linux ({sys.platform})" for m in MECHANISMS}
        return found
    found.session = hasattr(os, "setsid")
    found.capabilities = True
    module, why = _seccomp_module()
    found.seccomp = module is not None
    if why:
        found.missing["seccomp"] = why
    found.landlock_abi, why = _landlock_abi()
    if why:
        found.missing["landlock"] = why
    return found


# --------------------------------------------------------------------------- the steps
def _drop_capabilities() -> None:
    """Empty every capability set (root keeps its uid, loses its powers)."""
    libc = _libc()
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except OSError:
        last = 63
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)        # EPERM without CAP_SETPCAP: nothing to drop
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(_LINUX_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/status") as f:
        eff = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
    if int(eff, 16) != 0:
        raise OSError(errno.EPERM, f"capabilities still effective after capset: {eff}")


def _no_new_privs() -> None:
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _seccomp(module) -> None:
    sc = module
    pid = os.getpid()
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)

    def add(action, name, *args):
        try:
            f.add_rule(action, name, *args)
        except (RuntimeError, ValueError, OSError) as exc:     # a call this architecture does not have
            if "does not exist" not in str(exc) and "Invalid argument" not in str(exc) \
                    and getattr(exc, "errno", None) not in (errno.EINVAL, errno.EFAULT, errno.EDOM):
                raise

    for name in _REFUSED:
        add(deny, name)
    # signals only to the worker itself (its children inherit this pid: they may signal
    # the worker, which is in the same confinement, and no one else)
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        add(deny, name, sc.Arg(0, sc.NE, pid))
    for request in (_TIOCSTI, _TIOCLINUX):
        add(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    add(deny, "prctl", sc.Arg(0, sc.EQ, _PR_SET_DUMPABLE))
    # no network: IPv4, IPv6 and raw packet sockets (UNIX sockets stay, fuseval's channel is one)
    for family in (2, 10, 17):          # AF_INET, AF_INET6, AF_PACKET
        add(sc.ERRNO(errno.EACCES), "socket", sc.Arg(0, sc.EQ, family))
    for flag in _CLONE_NAMESPACES:
        add(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory a filter cannot read: refused with ENOSYS, which
    # makes the C library fall back to clone, whose flags the rules above see
    add(sc.ERRNO(errno.ENOSYS), "clone3")
    f.set_attr(sc.Attr.CTL_TSYNC, 1)
    f.load()


def _landlock(plan: Plan) -> int:
    import landlockpy as ll
    abi = int(ll.abi_version())
    every = ll.fs_for_abi(abi)
    read = ll.AccessFS.READ_FILE | ll.AccessFS.READ_DIR | ll.AccessFS.EXECUTE
    device = ll.AccessFS.READ_FILE | ll.AccessFS.WRITE_FILE | ll.AccessFS.TRUNCATE | ll.AccessFS.IOCTL_DEV
    with ll.Ruleset(scoped=ll.Scope.ABSTRACT_UNIX_SOCKET | ll.Scope.SIGNAL) as rules:
        rules.allow_path("/", read)
        for folder in (plan.scratch, plan.cache, "/dev/shm"):
            if os.path.isdir(folder):
                rules.allow_path(folder, every)
        for pattern in _DEVICE_GLOBS:
            for path in glob.glob(pattern):
                if not os.path.isdir(path):
                    rules.allow_path(path, device)
        if plan.gpu:
            # the CUDA driver opens files of its own process's /proc folder for writing
            # (cudaGetDeviceCount fails with error 304 without); those files reach only
            # this process, which the rest of the confinement already holds
            rules.allow_path(f"/proc/{os.getpid()}", every)
        rules.restrict()
    return abi


def _environment(plan: Plan) -> None:
    """Where the worker's tools write: its scratch folder and the shared compiler caches."""
    os.environ["TMPDIR"] = plan.scratch
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(plan.cache, "triton"))
    os.environ.setdefault("CUDA_CACHE_PATH", os.path.join(plan.cache, "nv"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(plan.cache, "inductor"))
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    tempfile.tempdir = plan.scratch
    os.chdir(plan.scratch)


def enter(plan: Plan) -> Applied:
    """Confine this process (see the module's docstring). Call it first, from the main
    thread, before importing torch. Returns what was applied; a mechanism the machine
    lacks is named in ``missing``."""
    done = Applied()
    if not sys.platform.startswith("linux"):
        _environment(plan)
        done.missing = {m: f"not Linux ({sys.platform})" for m in MECHANISMS}
        return done
    try:
        os.setsid()
        done.session = True
    except OSError as exc:
        done.missing["session"] = f"setsid failed ({exc})"
    for step in (lambda: open("/proc/self/oom_score_adj", "w").write("1000"),
                 lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))):
        try:
            step()
        except (OSError, ValueError):
            pass
    _environment(plan)
    try:
        _drop_capabilities()
        done.capabilities = True
    except OSError as exc:
        done.missing["capabilities"] = str(exc)
    _no_new_privs()
    module, why = _seccomp_module()
    if module is None:
        done.missing["seccomp"] = why
    else:
        try:
            _seccomp(module)
            done.seccomp = True
        except Exception as exc:  # noqa: BLE001 - reported: the worker runs without it
            done.missing["seccomp"] = f"loading the filter failed ({type(exc).__name__}: {exc})"
    abi, why = _landlock_abi()
    if not abi:
        done.missing["landlock"] = why
    else:
        try:
            done.landlock_abi = _landlock(plan)
        except Exception as exc:  # noqa: BLE001 - reported: the worker runs without it
            done.missing["landlock"] = f"enforcing the ruleset failed ({type(exc).__name__}: {exc})"
    return done


# --------------------------------------------------------------------------- fuseval's side
class ConfinementWarning(UserWarning):
    """The worker runs without a confinement mechanism this machine lacks."""


_probe: list[Applied] = []


def confinement() -> Applied:
    """What a worker's confinement is on this machine (probed once per process)."""
    if not _probe:
        _probe.append(probe())
    return _probe[0]


# open files fuseval's process needs beside its workers: each input of a call travels as
# a file descriptor, cached while its tensor lives
MIN_OPEN_FILES = 256


def ensure_open_files(need: int = MIN_OPEN_FILES) -> None:
    """Raise the soft open-file limit to ``need`` where the hard limit allows it; a
    :class:`~fuseval.errors.ResourceLimitError` saying what to do where it does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ResourceLimitError(f"the open-file limit is {soft} (hard limit {hard}); fuseval needs at least {need}: "
                                 "its workers receive every input as a file descriptor. Raise it (ulimit -n "
                                 f"{need}) and run again")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def cache_folder() -> str:
    """The compiler caches every worker may write (``FUSEVAL_WORKER_CACHE``, else
    ``~/.cache/fuseval/workers``)."""
    root = os.environ.get("FUSEVAL_WORKER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fuseval", "workers")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


_warned: set[str] = set()


def warn_missing(applied: Mapping[str, Any]) -> None:
    """Say once per process which confinement mechanisms the workers run without."""
    for name, why in dict(applied.get("missing") or {}).items():
        if name not in _warned:
            _warned.add(name)
            warnings.warn(ConfinementWarning(f"the implementation's worker runs without {name}: {why}"), stacklevel=3)
