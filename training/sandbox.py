"""Run untrusted, model-written Python against hidden tests, under bubblewrap, and score it here.

The child only receives the test inputs and sends back one output per test; the parent compares
them with expected values it never sent and voids any malformed results channel (forgery). The
child runs under bubblewrap: a minimal read-only root, a size-limited tmpfs, new namespaces, a
seccomp filter, whole-sandbox limits. Every anomaly is a scored failure, never a crash or NaN;
without bubblewrap there is no weaker fallback. The threat model: docs/sandbox.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import re
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STARTUP_GRACE_S = (
    2.0  # bwrap + interpreter start, on top of the user's wall budget (loaded 2-core CI)
)
_CHANNEL_CAP = 4 * 1024 * 1024  # bytes of results the parent reads; more is an anomaly, not a crash
_MAX_DEPTH = (
    64  # JSON nesting the parent accepts on the results channel (json.loads recursion is C)
)
_STDERR_TAIL = 64 * 1024
_SHM_BYTES = 1 << 20  # /dev/shm: POSIX shm_open needs a folder; nothing legitimate fills it
_SANDBOX_DIR = "/sandbox"
_UNAVAILABLE = "sandbox unavailable"
_INNER_ID = 65534  # the uid/gid the code sees inside ("nobody")
# As root, bwrap runs as a dedicated host uid per run, drawn far above any real account or container
# subuid range: the sandbox is never host root (kuid 0 may write sysctls even without capabilities).
SANDBOX_UID_BASE = 2_000_000_000
SANDBOX_UID_SPAN = 1_000_000
_STAGE_ROOT = Path(
    "/var/tmp"
)  # root mode: where an interpreter the dedicated uid cannot reach is linked
_STAGE_LAYOUT = 2  # bump when what _link_copy stages changes


@dataclass(frozen=True)
class SandboxResult:
    passed: (
        int  # tests whose output came back AND equals the expected value (compared in the parent)
    )
    total: int
    ran: int  # tests whose output actually came back from the child
    error: str | None  # why the run is not a clean pass/fail list; None when every test ran cleanly
    notes: list[str] = field(
        default_factory=list
    )  # what containment was enforced (parent-written only)
    failures: list[str] = field(default_factory=list)  # short per-test failure lines (first few)
    timed_out: bool = False
    duration_s: float = 0.0
    run_id: str = ""  # also in the sandbox's command line, so a survivor could be found by it

    @property
    def fraction(self) -> float:
        """The score: passed / total, 0.0 for every anomaly (passed is forced to 0
        there), never NaN."""
        return self.passed / self.total if self.total > 0 else 0.0


class SandboxUnavailable(Exception):
    """bwrap or the interpreter's runtime cannot be set up: refuse, never run weaker."""


def run_tests(
    code: str,
    func_name: str,
    tests: Sequence[tuple[Sequence[Any], Any]],
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_procs: int = 8,
    file_size_mb: int = 16,
    disk_mb: int = 32,
    python: str = sys.executable,
    max_failures_listed: int = 3,
) -> SandboxResult:
    """Run `code`, call `func_name(*args)` for each hidden test, and score it in this process.

    `tests` are (args, expected) pairs; only the args (JSON) reach the child. Outputs and expected
    values are compared after a JSON round trip (tuples == lists; floats with a small tolerance;
    bool is not int). `memory_mb` bounds each process's address space and, with a cgroup, the
    whole sandbox (plus `disk_mb`, since tmpfs pages are memory); `max_procs` counts tasks
    (threads too); `disk_mb` is the size of the working tmpfs. Never raises: any failure is a
    result with passed 0."""
    t0 = time.monotonic()
    run_id = secrets.token_hex(6)
    limits = _Limits(timeout_s, memory_mb, max_procs, file_size_mb, disk_mb)
    try:
        return _run(code, func_name, tests, limits, python, max_failures_listed, run_id, t0)
    except SandboxUnavailable as exc:
        return _failed(tests, f"{_UNAVAILABLE}: {exc}", [], t0, run_id)
    except (
        Exception
    ) as exc:  # fail closed: a harness bug is a failed submission, never a trainer crash
        return _failed(
            tests, f"sandbox error: {type(exc).__name__}: {str(exc)[:300]}", [], t0, run_id
        )


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_mb: int
    max_procs: int
    file_size_mb: int
    disk_mb: int

    def rlimits(self) -> dict[str, list[int]]:
        cpu = max(1, math.ceil(self.timeout_s))
        fsize = self.file_size_mb << 20
        return {
            "RLIMIT_CPU": [cpu, cpu + 1],
            "RLIMIT_AS": [self.memory_mb << 20] * 2,
            "RLIMIT_FSIZE": [fsize] * 2,
            "RLIMIT_NOFILE": [64, 64],
            "RLIMIT_CORE": [0, 0],
            "RLIMIT_NPROC": [self.max_procs] * 2,
        }


def _failed(tests: Sequence, error: str, notes: list[str], t0: float, run_id: str) -> SandboxResult:
    return SandboxResult(
        passed=0,
        total=len(tests),
        ran=0,
        error=error,
        notes=notes,
        duration_s=round(time.monotonic() - t0, 3),
        run_id=run_id,
    )


def _run(
    code: str,
    func_name: str,
    tests: Sequence[tuple[Sequence[Any], Any]],
    limits: _Limits,
    python: str,
    max_failures_listed: int,
    run_id: str,
    t0: float,
) -> SandboxResult:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap not installed (apt-get install bubblewrap)")
    version_note = _bwrap_note(bwrap)
    uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN) if os.geteuid() == 0 else None
    runtime = _sandbox_runtime(python, uid)
    payload = json.dumps(
        {
            "code": code,
            "func_name": func_name,
            "inputs": [list(args) for args, _ in tests],
            "rlimits": limits.rlimits(),
        }
    )
    notes = [version_note, *runtime.notes, _uid_note(uid)]
    # Parent-only files: the child reaches them through inherited fds, never by path (0711: bwrap,
    # run as the sandbox uid, may traverse it to bind the empty file, but not list it).
    base = Path(tempfile.mkdtemp(prefix="sandbox-"))
    base.chmod(0o711)
    cgroup: _Cgroup | None = None
    try:
        cgroup, cgroup_note = _Cgroup.create(run_id, limits, uid)
        notes.append(cgroup_note)
        exchange = _Exchange(base, payload)
        notes += _filter_note(exchange.has_filter)
        returncode, timed_out = _execute(bwrap, runtime, limits, exchange, cgroup, run_id, uid)
        survived = _ensure_gone(exchange.child_pid(), cgroup)
        out, err = exchange.results(), exchange.stderr_tail()
        oom = cgroup is not None and cgroup.oom_killed()
    finally:
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(base, ignore_errors=True)
    run = _Outcome(returncode, timed_out, survived, oom, bwrap_started=exchange.started)
    return _verdict(
        out, err, tests, run, limits, notes, max_failures_listed, time.monotonic() - t0, run_id
    )


# ---------------------------------------------------------------------------------------------
# The interpreter's runtime inside the sandbox


@dataclass(frozen=True)
class _Runtime:
    binds: tuple[tuple[str, str], ...]  # (host path, sandbox path), read-only
    hide: tuple[str, ...]  # sandbox folders covered by an empty read-only tmpfs (site-packages)
    notes: tuple[str, ...]


_PROBE = (
    "import sys, sysconfig, json; print(json.dumps({'prefix': sys.base_prefix, 'stdlib': "
    "sysconfig.get_paths()['stdlib'], 'dynload': [p for p in sys.path if "
    "p.endswith('lib-dynload')], 'version': '%d.%d' % sys.version_info[:2]}))"
)


def _sandbox_runtime(python: str, uid: int | None) -> _Runtime:
    for _ in range(2):
        runtime = _runtime(os.path.realpath(python))
        if uid is not None:
            runtime = _for_others(runtime)
        if all(os.path.exists(host) for host, _ in runtime.binds):
            return runtime
        # An upgrade or a /var/tmp clean-up moved files under the cache: look again
        _runtime.cache_clear()
        _for_others.cache_clear()
    raise SandboxUnavailable(f"the runtime files of {python} keep disappearing")


@functools.lru_cache(maxsize=8)
def _runtime(exe: str) -> _Runtime:
    """What `exe` needs, relocated under /python: the binary, its stdlib folder and the shared
    libraries (of the binary and of every extension module). Cached: ldd takes a few hundred ms."""
    if not os.access(exe, os.X_OK):
        raise SandboxUnavailable(f"interpreter {exe} is not executable")
    probe = subprocess.run(
        [exe, "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=60, env={}
    )
    if probe.returncode != 0:
        raise SandboxUnavailable(
            f"interpreter {exe} failed to start: {probe.stderr.strip()[-200:]}"
        )
    info = json.loads(probe.stdout)
    stdlib, version = os.path.realpath(info["stdlib"]), info["version"]
    dynload = [os.path.realpath(d) for d in info["dynload"] if os.path.isdir(d)]
    if any(not d.startswith(stdlib + "/") for d in dynload):
        raise SandboxUnavailable(f"lib-dynload outside {stdlib}: unsupported interpreter layout")
    inner_stdlib = f"/python/lib/python{version}"
    binds = [(exe, "/python/bin/python3"), (stdlib, inner_stdlib)]
    objects = [exe] + [str(p) for d in dynload for p in sorted(Path(d).glob("*.so"))]
    libs, loader = _shared_libraries(objects)
    binds += [(path, f"/python/lib/{name}") for name, path in libs.items()]
    binds += [(os.path.realpath(loader), loader)]
    hide = tuple(
        f"{inner_stdlib}/{d}"
        for d in ("site-packages", "dist-packages")
        if os.path.isdir(f"{stdlib}/{d}")
    )
    note = (
        f"root: read-only /python (python {version} from {os.path.dirname(os.path.dirname(exe))}, "
        f"stdlib{' without site-packages' if hide else ''}, {len(libs)} shared libraries) and "
        f"{loader}"
    )
    return _Runtime(tuple(binds), hide, (note,))


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
_LDD_LOADER = re.compile(r"^\s*(/\S*ld-linux\S*)\s+\(0x[0-9a-f]+\)\s*$")


def _shared_libraries(objects: list[str]) -> tuple[dict[str, str], str]:
    """{soname: real path} for everything `objects` link, and the dynamic loader's own path."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailable(
            "ldd not found (package libc-bin): cannot list the interpreter's libraries"
        )
    out = subprocess.run(
        [ldd, *objects], capture_output=True, text=True, timeout=120, env={"LC_ALL": "C"}
    ).stdout
    libs: dict[str, str] = {}
    loader = ""
    for line in out.splitlines():
        if m := _LDD_LINE.match(line):
            libs.setdefault(m.group(1), os.path.realpath(m.group(2)))
        elif m := _LDD_LOADER.match(line):
            loader = loader or m.group(1)
    if not loader:
        raise SandboxUnavailable(f"no dynamic loader in ldd's output for {objects[0]}")
    return libs, loader


_BWRAP_MIN = (0, 8, 0)  # --disable-userns, and --size for tmpfs (Debian 12 ships 0.8.0)


@functools.lru_cache(maxsize=4)
def _bwrap_note(bwrap: str) -> str:
    """Also the version check: an older bwrap cannot size the tmpfs, so it is refused, not used."""
    out = subprocess.run(
        [bwrap, "--version"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    found = tuple(int(x) for x in re.findall(r"\d+", out)[:3])
    if found < _BWRAP_MIN:
        raise SandboxUnavailable(
            f"bubblewrap >= {'.'.join(map(str, _BWRAP_MIN))} needed, found {out!r}"
        )
    return (
        f"{out}: new user, PID, network, IPC, UTS and cgroup namespaces, no further user "
        "namespaces, no capabilities, new session, dies with its parent, read-only /proc"
    )


def _uid_note(uid: int | None) -> str:
    if uid is None:
        return f"bwrap ran as the caller's uid {os.getuid()} (nobody inside); no privilege to drop"
    return f"bwrap ran as dedicated host uid {uid} (nobody inside), never as root"


@functools.lru_cache(maxsize=8)
def _for_others(runtime: _Runtime) -> _Runtime:
    """The runtime as the dedicated uid can reach it. What it cannot (e.g. a pyenv under /root, mode
    0700) is hard-linked (copied across filesystems) once into a root-owned, world-readable
          folder."""
    todo = tuple((host, inner) for host, inner in runtime.binds if not _readable_by_others(host))
    if not todo:
        return runtime
    # Keyed by paths and modification times: a reinstalled interpreter gets a fresh folder.
    key = repr((_STAGE_LAYOUT, todo, [os.stat(host).st_mtime_ns for host, _ in todo]))
    stage = _STAGE_ROOT / f"rd-sandbox-runtime-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not os.path.lexists(stage):
        _build_stage(stage, todo)
    st = os.lstat(stage)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxUnavailable(f"{stage} is not a root-owned folder closed to writes by others")
    moved = {host: str(stage / inner.lstrip("/")) for host, inner in todo}
    binds = tuple((moved.get(host, host), inner) for host, inner in runtime.binds)
    return _Runtime(
        binds, runtime.hide, runtime.notes + (f"runtime linked into {stage} for the sandbox uid",)
    )


def _readable_by_others(path: str) -> bool:
    p = Path(path)
    try:
        if not os.stat(p).st_mode & stat.S_IROTH:
            return False
        return all(
            os.stat(d).st_mode & stat.S_IXOTH for d in ([p] if p.is_dir() else []) + list(p.parents)
        )
    except OSError:
        return False


def _build_stage(stage: Path, todo: tuple[tuple[str, str], ...]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f"{stage.name}-", dir=stage.parent))
    try:
        for host, inner in todo:
            _link_copy(Path(host), tmp / inner.lstrip("/"))
        for d, _, _ in os.walk(tmp):
            os.chmod(d, 0o755)
        os.rename(
            tmp, stage
        )  # atomic; fails if a concurrent run got there first (then theirs is used)
    except OSError:
        if not os.path.lexists(stage):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_NOT_STAGED = {"site-packages", "dist-packages", "test"}  # __pycache__ stays: start-up time


def _link_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        dst.mkdir(exist_ok=True)
        for child in src.iterdir():
            if child.name in _NOT_STAGED and child.is_dir():
                (dst / child.name).mkdir()  # site-packages stays a (hidden) mount point
            elif not child.is_symlink() or child.resolve().is_relative_to(src):
                _link_copy(child, dst / child.name)
        return
    try:
        if not os.stat(src).st_mode & stat.S_IROTH:
            raise PermissionError("not world-readable: copy it")
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o755 if os.access(src, os.X_OK) else 0o644)


# ---------------------------------------------------------------------------------------------
# seccomp: a classic-BPF deny list, handed to bwrap (--seccomp FD), which loads it just before exec

# Syscalls added since Linux 5.1 share one number on every architecture.
_COMMON_NRS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "memfd_secret": 447,
}
_ARCHES = {  # machine -> (AUDIT_ARCH, {syscall: nr}); numbers from the kernel's unistd tables
    "x86_64": (
        0xC000003E,
        _COMMON_NRS
        | {
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "memfd_create": 319,
            "shmget": 29,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "open_by_handle_at": 304,
            "fork": 57,
            "vfork": 58,
            "clone": 56,
        },
    ),
    "aarch64": (
        0xC00000B7,
        _COMMON_NRS
        | {  # asm-generic table: no fork/vfork syscalls at all
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "memfd_create": 279,
            "shmget": 194,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "open_by_handle_at": 265,
            "clone": 220,
        },
    ),
}
SECCOMP_DENY = tuple(n for n in _ARCHES["x86_64"][1] if n not in ("clone", "clone3"))
_CLONE_THREAD = 0x00010000
_CLONE_NEW_NAMESPACES = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine, or None where we have no syscall table (then the notes say
    so). Wrong architecture (e.g. the x32 ABI) kills the process; listed syscalls fail with
    EPERM; clone3 fails with ENOSYS so the C library falls back to clone, whose flags we can
    check: threads only."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nrs = arch
    prog = [
        _bpf(_LD_ABS, 4),
        _bpf(_JEQ, audit_arch, 1, 0),
        _bpf(_RET, _RET_KILL_PROCESS),
        _bpf(_LD_ABS, 0),
    ]
    if audit_arch == 0xC000003E:
        prog += [
            _bpf(_JGE, 0x40000000, 0, 1),
            _bpf(_RET, _RET_ERRNO | _EPERM),
        ]  # x32 syscall numbers
    for name in SECCOMP_DENY:
        if name in nrs:
            prog += [_bpf(_JEQ, nrs[name], 0, 1), _bpf(_RET, _RET_ERRNO | _EPERM)]
    prog += [_bpf(_JEQ, nrs["clone3"], 0, 1), _bpf(_RET, _RET_ERRNO | _ENOSYS)]
    prog += [
        _bpf(_JEQ, nrs["clone"], 0, 5),  # not clone: allow (the last instruction)
        _bpf(
            _LD_ABS, 16
        ),  # low 32 bits of args[0], the flags (little-endian machines only, as listed)
        _bpf(_JSET, _CLONE_NEW_NAMESPACES, 2, 0),
        _bpf(_JSET, _CLONE_THREAD, 0, 1),
        _bpf(_RET, _RET_ALLOW),
        _bpf(_RET, _RET_ERRNO | _EPERM),
        _bpf(_RET, _RET_ALLOW),
    ]
    return b"".join(prog)


def _filter_note(has_filter: bool) -> list[str]:
    if has_filter:
        return [
            f"seccomp: {len(SECCOMP_DENY)} syscalls refused (keyrings, memfd, SysV shm, mounts, "
            "namespaces, ptrace, bpf, io_uring, fork); clone allowed for threads only"
        ]
    return [f"seccomp: no syscall table for {platform.machine()}: no filter, processes are allowed"]


# ---------------------------------------------------------------------------------------------
# Whole-sandbox limits: a per-run cgroup (v1 memory + pids hierarchies) when we may create one


class _Cgroup:
    """A child of this process's own memory and pids cgroups, so the host's limits still apply above
    it. The command joins it from a root shell prelude before exec'ing bwrap: every sandbox task is
    born inside it (moving a pid in afterwards would race with its first fork)."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def create(cls, run_id: str, limits: _Limits, uid: int | None) -> tuple[_Cgroup | None, str]:
        without = (
            "limits: no cgroup ({why}); whole-sandbox bounds are the tmpfs sizes ({disk} MB + 1 MB "
            "/dev/shm), RLIMIT_AS {mem} MB per process, RLIMIT_NPROC {procs} inside the user "
            "namespace and no fork (seccomp)"
        )
        fmt = {"disk": limits.disk_mb, "mem": limits.memory_mb, "procs": limits.max_procs}
        if os.geteuid() != 0:
            return None, without.format(why="not root", **fmt)
        parents = {c: _own_cgroup_v1(c) for c in ("memory", "pids")}
        missing = [c for c, p in parents.items() if p is None]
        if missing:
            return None, without.format(
                why=f"no writable cgroup v1 {'/'.join(missing)} hierarchy", **fmt
            )
        dirs = {c: p / f"rd-sandbox-{run_id}" for c, p in parents.items() if p is not None}
        group = cls({})
        memory = (limits.memory_mb + limits.disk_mb + 1) << 20  # tmpfs pages are charged here too
        try:
            for controller, path in dirs.items():
                path.mkdir()
                group.dirs[controller] = path
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))
            _try_write(
                dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory)
            )  # no swapping out of it
            (dirs["pids"] / "pids.max").write_text(
                str(limits.max_procs + 3)
            )  # + bwrap, its init, the shell
            for procs in group.procs_files():
                os.chown(
                    procs, uid if uid is not None else 0, -1
                )  # so the prelude, as that uid, can join
        except OSError as exc:
            group.remove()
            return None, without.format(why=f"cgroup setup failed: {exc}", **fmt)
        return group, (
            f"limits: cgroup v1 per run, memory {memory >> 20} MB for the whole sandbox (tmpfs and "
            f"memfd pages included, no swap), {limits.max_procs + 3} tasks"
        )

    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                found |= {int(x) for x in (path / "cgroup.procs").read_text().split()}
        return found

    def kill_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def oom_killed(self) -> bool:
        try:
            text = (self.dirs["memory"] / "memory.oom_control").read_text()
        except (OSError, KeyError):
            return False
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        return bool(m and int(m.group(1)) > 0)

    def remove(self) -> None:
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def _own_cgroup_v1(controller: str) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            path = Path("/sys/fs/cgroup") / parts[1] / parts[2].lstrip("/")
            if (path / "cgroup.procs").exists() and os.access(path, os.W_OK):
                return path
    return None


def _try_write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # memsw only exists with swap accounting on
        path.write_text(text)


# ---------------------------------------------------------------------------------------------
# The command and the process


class _Exchange:
    """The parent's files: the child's stdin (config), the results channel (its fd 1), its stderr,
    bwrap's info file (the sandbox init's host pid) and the seccomp program."""

    def __init__(self, base: Path, payload: str) -> None:
        self.base = base
        (base / "in.json").write_text(payload)
        (base / "empty").touch(mode=0o444)
        program = seccomp_program()
        self.has_filter = program is not None
        if program is not None:
            (base / "seccomp.bpf").write_bytes(program)
        self.started = False

    def open_files(self) -> dict[str, Any]:
        """The child's files, by role; they outlive this call: the caller closes them."""
        names = {
            "stdin": ("in.json", "rb"),
            "stdout": ("out", "wb"),
            "stderr": ("err", "wb"),
            "info": ("info", "wb"),
        }
        if self.has_filter:
            names["seccomp"] = ("seccomp.bpf", "rb")
        return {role: open(self.base / name, mode) for role, (name, mode) in names.items()}  # noqa: SIM115

    def child_pid(self) -> int | None:
        try:
            info = json.loads((self.base / "info").read_text() or "null")
        except (OSError, ValueError):
            return None
        self.started = isinstance(info, dict) and isinstance(info.get("child-pid"), int)
        return info["child-pid"] if self.started else None

    def results(self) -> bytes:
        with open(self.base / "out", "rb") as f:
            return f.read(_CHANNEL_CAP + 1)

    def stderr_tail(self) -> str:
        with open(self.base / "err", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _STDERR_TAIL))
            return f.read().decode("utf-8", "replace")


def _command(
    bwrap: str,
    runtime: _Runtime,
    limits: _Limits,
    info_fd: int,
    seccomp_fd: int | None,
    run_id: str,
    empty: str,
) -> list[str]:
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--new-session",
        "--die-with-parent",
        "--uid",
        str(_INNER_ID),
        "--gid",
        str(_INNER_ID),
        "--info-fd",
        str(info_fd),
    ]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for host, inner in runtime.binds:
        argv += ["--ro-bind", host, inner]
    for inner in runtime.hide:
        argv += ["--size", "4096", "--perms", "0555", "--tmpfs", inner, "--remount-ro", inner]
    # /proc/keys lists the descriptions of keys in the session keyring bwrap inherits
    # (keyctl is refused).
    argv += [
        "--proc",
        "/proc",
        "--ro-bind",
        empty,
        "/proc/keys",
        "--ro-bind",
        empty,
        "/proc/key-users",
        "--remount-ro",
        "/proc",
    ]
    argv += [
        "--dev",
        "/dev",
        "--size",
        str(_SHM_BYTES),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--size",
        str(limits.disk_mb << 20),
        "--perms",
        "0700",
        "--tmpfs",
        _SANDBOX_DIR,
        "--symlink",
        _SANDBOX_DIR,
        "/tmp",
        "--remount-ro",
        "/",
        "--chdir",
        _SANDBOX_DIR,
        "--clearenv",
        "--setenv",
        "LD_LIBRARY_PATH",
        "/python/lib",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "HOME",
        _SANDBOX_DIR,
        "--setenv",
        "TMPDIR",
        _SANDBOX_DIR,
        "/python/bin/python3",
        "-I",
        "-S",
        "-c",
        _HARNESS,
        f"rd-sandbox-{run_id}",
    ]
    return argv


def _execute(
    bwrap: str,
    runtime: _Runtime,
    limits: _Limits,
    exchange: _Exchange,
    cgroup: _Cgroup | None,
    run_id: str,
    uid: int | None,
) -> tuple[int | None, bool]:
    """Start bwrap (through a shell prelude that joins the cgroup first), wait for it, and SIGKILL
    its process group on timeout. Returns (returncode, timed_out). cwd "/" and an empty
    environment: the sandbox init's own environ (readable inside as /proc/1/environ) names nothing
    of the host."""
    files = exchange.open_files()
    try:
        seccomp = files.get("seccomp")
        argv = _command(
            bwrap,
            runtime,
            limits,
            files["info"].fileno(),
            seccomp.fileno() if seccomp else None,
            run_id,
            str(exchange.base / "empty"),
        )
        joins = "".join(f'echo $$ > "{p}" && ' for p in (cgroup.procs_files() if cgroup else []))
        extra = [
            f.fileno() for k, f in files.items() if k in ("info", "seccomp")
        ]  # same numbers in the child
        proc = subprocess.Popen(
            ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *argv],
            stdin=files["stdin"],
            stdout=files["stdout"],
            stderr=files["stderr"],
            env={},
            cwd="/",
            close_fds=True,
            pass_fds=extra,
            start_new_session=True,
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
        )
        timed_out = False
        try:
            returncode: int | None = proc.wait(timeout=limits.timeout_s + _STARTUP_GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out, returncode = True, None
        finally:
            _kill_group(proc)
        return returncode, timed_out
    finally:
        for f in files.values():
            f.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """bwrap's outer process leads this group; its death SIGKILLs the sandbox init
    (die-with-parent), and the death of a PID namespace's init kills every process in it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable only in D state
        proc.wait(timeout=10)


def _ensure_gone(init_pid: int | None, cgroup: _Cgroup | None, deadline_s: float = 5.0) -> bool:
    """Wait until the sandbox's PID namespace init has gone (and the cgroup is empty). True if
    something survived the deadline: the caller fails the run."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cgroup is not None:
            cgroup.kill_all()
        alive = (init_pid is not None and _alive(init_pid)) or (
            cgroup is not None and bool(cgroup.pids())
        )
        if not alive:
            return False
        time.sleep(0.01)
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ---------------------------------------------------------------------------------------------
# Reading the results channel, defensively, and the verdict


@dataclass(frozen=True)
class _Outcome:
    returncode: int | None
    timed_out: bool
    survived: bool
    oom: bool
    bwrap_started: bool


@dataclass
class _Channel:
    cases: dict[int, dict[str, Any]] = field(default_factory=dict)
    load_error: str | None = None
    started: bool = False
    done: bool = False
    anomaly: str | None = None  # set: the run is void (passed 0), whatever else came back


def parse_channel(raw: bytes, total: int) -> _Channel:
    """The harness writes `{"t": "ready"}`, then `load_error` or one `case` per test in order, then
    `done`, one JSON object per line. Anything else was written (or cut) by the user's code."""
    ch = _Channel()
    if not raw:
        return ch
    if len(raw) > _CHANNEL_CAP:
        ch.anomaly = f"results channel over {_CHANNEL_CAP >> 20} MB"
        return ch
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        ch.anomaly = "results channel is not UTF-8"
        return ch
    if not text.endswith("\n"):
        ch.anomaly = "results channel truncated (no final newline)"
        return ch
    for n, line in enumerate(text[:-1].split("\n"), 1):
        problem = _take_line(ch, line, total)
        if problem:
            ch.anomaly = f"results channel line {n}: {problem}"
            return ch
    return ch


def _take_line(ch: _Channel, line: str, total: int) -> str | None:
    msg, problem = _decode(line)
    if problem:
        return problem
    kind = msg.get("t")
    if ch.done:
        return "a line after the done marker"
    if not ch.started:
        if kind != "ready" or len(msg) != 1:
            return "no start marker (channel overwritten or truncated)"
        ch.started = True
    elif kind == "case":
        return _take_case(ch, msg, total)
    elif (
        kind == "load_error"
        and not ch.cases
        and ch.load_error is None
        and isinstance(msg.get("err"), str)
    ):
        ch.load_error = msg["err"][:300]
    elif kind == "done" and len(msg) == 1:
        ch.done = True
    else:
        return f"unexpected line of kind {str(kind)[:40]!r}"
    return None


def _take_case(ch: _Channel, msg: dict[str, Any], total: int) -> str | None:
    i, ok = msg.get("i"), msg.get("ok")
    if type(i) is not int or not 0 <= i < total or type(ok) is not bool:
        return "malformed case line"
    if i != len(ch.cases) or ch.load_error is not None:
        return f"case {i} out of order or duplicated"  # the harness writes 0, 1, 2... once each
    if (ok and "out" not in msg) or (not ok and not isinstance(msg.get("err"), str)):
        return "malformed case line"
    ch.cases[i] = msg
    return None


def _decode(line: str) -> tuple[dict[str, Any], str | None]:
    if _too_deep(line):
        return {}, f"nested deeper than {_MAX_DEPTH} levels"
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return {}, f"not JSON ({type(exc).__name__})"
    if not isinstance(msg, dict):
        return {}, f"not a JSON object ({type(msg).__name__})"
    return msg, None


def _too_deep(line: str) -> bool:
    """Bracket depth outside strings, without recursion (json.loads and our comparison recurse)."""
    if line.count("[") + line.count("{") <= _MAX_DEPTH:
        return False
    depth, in_string, escaped = 0, False, False
    for ch in line:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _verdict(
    raw: bytes,
    err: str,
    tests: Sequence[tuple[Sequence[Any], Any]],
    run: _Outcome,
    limits: _Limits,
    notes: list[str],
    max_failures_listed: int,
    duration_s: float,
    run_id: str,
) -> SandboxResult:
    total = len(tests)
    ch = parse_channel(raw, total)
    notes = notes + [_limits_note(limits)]
    if run.survived:
        notes.append("sandbox processes survived the kill: run voided")
    else:
        notes.append("every sandbox process was gone after the run")
    passed, failures = _compare(ch.cases, tests, max_failures_listed)
    error = _error(ch, run, err, limits.timeout_s, total)
    if ch.anomaly or run.survived or not ch.started or ch.load_error is not None:
        passed = 0  # a void run scores nothing, whatever outputs came back with it
    return SandboxResult(
        passed=passed,
        total=total,
        ran=len(ch.cases),
        error=error,
        notes=notes,
        failures=failures,
        timed_out=run.timed_out,
        duration_s=round(duration_s, 3),
        run_id=run_id,
    )


def _limits_note(limits: _Limits) -> str:
    return (
        f"rlimits per process: cpu={max(1, math.ceil(limits.timeout_s))}s as={limits.memory_mb}MB "
        f"fsize={limits.file_size_mb}MB nofile=64 nproc={limits.max_procs} core=0; wall "
        f"{limits.timeout_s:g}s; /sandbox tmpfs {limits.disk_mb} MB"
    )


def _error(ch: _Channel, run: _Outcome, err: str, timeout_s: float, total: int) -> str | None:
    came_back = f"({len(ch.cases)}/{total} outputs came back)"
    if ch.anomaly:
        return ch.anomaly
    if run.survived:
        return "sandbox processes survived the kill"
    if not ch.started:
        if not run.bwrap_started and not run.timed_out:
            return f"sandbox setup failed (rc={run.returncode}): {_tail(err)}"
        return (
            "results channel empty: truncated, or the harness died before starting "
            f"(rc={run.returncode})"
        )
    if ch.load_error is not None:
        return f"code failed to load: {ch.load_error}"
    if run.oom:
        return f"killed: memory limit of the sandbox reached {came_back}"
    if run.timed_out:
        return f"timed out after {timeout_s:g}s wall {came_back}"
    signal_name = _signal_of(run.returncode)
    if signal_name:
        hint = " (CPU limit)" if signal_name == "SIGXCPU" else ""
        return f"killed by {signal_name}{hint} {came_back}"
    if not ch.done or len(ch.cases) < total:
        return f"exited early with code {run.returncode}, no done marker {came_back}"
    return None


def _signal_of(returncode: int | None) -> str | None:
    """bwrap exits 128 + N when the sandboxed process died of signal N."""
    if returncode is None or not 128 < returncode < 128 + 65:
        return None
    sig = returncode - 128
    return signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"


def _compare(
    cases: dict[int, dict[str, Any]], tests: Sequence[tuple[Sequence[Any], Any]], listed: int
) -> tuple[int, list[str]]:
    passed = 0
    failures: list[str] = []
    for i, (args, expected) in enumerate(tests):
        msg = cases.get(i)
        if msg is None:
            reason = "no output (did not run)"
        elif not msg["ok"]:
            reason = f"raised {msg['err'][:200]}"
        elif _same(msg["out"], _normalise(expected)):
            passed += 1
            continue
        else:
            reason = f"returned {_short(msg['out'])}, expected {_short(_normalise(expected))}"
        if len(failures) < listed:
            failures.append(f"{_short(list(args))}: {reason}")
    return passed, failures


def _normalise(value: Any) -> Any:
    """Expected values go through the same JSON round trip as the child's outputs
    (tuple -> list)."""
    return json.loads(json.dumps(value))


def _same(a: Any, b: Any) -> bool:
    # bool is a subclass of int in Python; True must not pass for 1 (or vice versa).
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (
                math.isnan(a) and math.isnan(b)
            )
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (ValueError, TypeError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-400:]


# The child harness, passed with -c (it is no file the child could find). Trusted code, but it runs
# inside the sandbox from its first instruction: it only sets rlimits, redirects the user's prints
# away from the results channel and installs bypassable stubs before it reads the user's code.
_HARNESS = r"""
import sys, os, json, signal, resource
cfg = json.loads(sys.stdin.buffer.read())
sys.stdin.close()
RES = os.dup(1)          # the results channel (a parent-owned file, reachable only through this fd)
os.dup2(2, 1)            # the user's prints go to the stderr capture, never to the results channel
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the file-size limit: EFBIG, not a silent death
for name, value in cfg.pop("rlimits").items():
    resource.setrlimit(getattr(resource, name), tuple(value))

def emit(msg):
    os.write(RES, (json.dumps(msg) + "\n").encode())

# Defence in depth only: seccomp (no fork), namespaces and limits are the fences; these stubs only
# turn the common attempts into clean PermissionErrors.
import socket, _socket, _posixsubprocess, posix
def _blocked(*args, **kwargs):
    raise PermissionError("blocked in the sandbox")
for mod in (os, posix):
    for name in ("fork", "forkpty", "system", "popen", "kill", "killpg", "execv", "execve",
                 "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve",
                 "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn",
                 "posix_spawnp"):
        if hasattr(mod, name):
            setattr(mod, name, _blocked)
_posixsubprocess.fork_exec = _blocked
class _NoSocket:
    def __init__(self, *args, **kwargs):
        raise PermissionError("network access is blocked in the sandbox")
for mod in (socket, _socket):
    for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection",
                 "create_server", "getaddrinfo"):
        if hasattr(mod, name):
            setattr(mod, name, _NoSocket)
for name in ("ctypes", "_ctypes", "ctypes.util"):
    sys.modules[name] = None
emit({"t": "ready"})

inputs = cfg.pop("inputs")
code, func_name = cfg.pop("code"), cfg.pop("func_name")
del cfg
ns = {"__name__": "__submission__"}
try:
    exec(compile(code, "<submission>", "exec"), ns)
    func = ns.get(func_name)
    if not callable(func):
        raise NameError("function %r is not defined" % func_name)
except BaseException as exc:
    emit({"t": "load_error", "err": ("%s: %s" % (type(exc).__name__, exc))[:300]})
    os._exit(1)

def jsonable(o):
    return {"__unserializable__": type(o).__name__}

for i, args in enumerate(inputs):
    try:
        out = func(*args)
        try:
            line = json.dumps({"t": "case", "i": i, "ok": True, "out": out}, default=jsonable)
        except BaseException as exc:  # tuple dict keys, cycles, absurd nesting...
            raise TypeError("output is not JSON-serialisable: %s" % str(exc)[:100])
    except BaseException as exc:  # SystemExit and KeyboardInterrupt count as failures of that test
        err = ("%s: %s" % (type(exc).__name__, exc))[:200]
        line = json.dumps({"t": "case", "i": i, "ok": False, "err": err})
    os.write(RES, (line + "\n").encode())
emit({"t": "done"})
os._exit(0)   # skip atexit handlers the user code may have registered
"""
