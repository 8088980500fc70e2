"""Run untrusted, model-written Python against hidden tests, in a contained child process.

Model code is hostile: it may read secrets, open sockets, fork-bomb, fill the disk, allocate 10 GB,
spin forever, or try to *forge* a pass (print "OK", exit 0 early, monkeypatch the runner, import the
hidden tests). The design answers the forgery class once and for all:

    the child only ever receives test *inputs*; it sends back one output per test as it computes it;
    the PARENT compares each output with the expected value it never sent.

So nothing the child does can make a wrong answer count as right, and a child that dies or exits early
simply returns fewer outputs (`ran` < `total`) and those tests fail. The rest of this module is
containment of the process itself. What is enforced (each step is recorded in `SandboxResult.notes`):

* a fresh interpreter, ``python -I -S`` (isolated mode, no site-packages, no PYTHON* env vars), with a
  scrubbed environment (PATH and LANG only): secrets in the parent's env are not inherited;
* its own session / process group (killed as a group afterwards) and, when we run as root, a dedicated
  random unprivileged uid/gid per run: files outside world-writable places are read-only to it, other
  processes (ours included) cannot be signalled or ptraced, /proc/<parent>/environ is unreadable,
  RLIMIT_NPROC binds (it never binds for root) and afterwards every process of that uid is SIGKILLed;
* rlimits: CPU seconds, address space, file size, open files, processes, no core dumps. They are set
  by the trusted harness itself right after exec, before it reads the user's code, rather than in a
  `preexec_fn`: the callers (Celery workers, TRL trainers) are multi-threaded, and Python documents
  `preexec_fn` as unsafe (deadlock-prone) with threads. The effect on the user code is the same;
* a wall-clock timeout;
* namespaces (root: unshare; non-root: inside a new user namespace when the kernel allows it): a new
  network namespace (only a downed loopback: nothing to connect to), and a new mount namespace in
  which /tmp, /var/tmp, /dev/shm, /run/lock are fresh private tmpfs (writes there vanish with the
  run) and the project folder, /root, /home... are hidden behind empty read-only tmpfs (the hidden
  tests and task bank cannot be read, even by path);
* the working directory is an empty temp dir inside a root-only 0700 parent (so ``..`` leads nowhere
  writable), removed afterwards;
* ``no_new_privs`` (setuid binaries cannot regain privileges);
* defence in depth only, NOT a guarantee: fork/exec/spawn/subprocess/socket/kill entry points are
  replaced by raising stubs and ``ctypes`` imports are blocked before the user code is compiled. A
  determined program can get the originals back (e.g. reloading a C module), which is why the real
  limits above exist.

What it cannot do (and why): there is no seccomp filter (no dependency-free way from Python), so the
kernel attack surface is the full syscall table; CPU/memory are rlimits per process, not a cgroup, so
``max_procs`` processes can each use ``memory_mb``; without root and without unprivileged user
namespaces, network and filesystem isolation degrade to the socket stubs and the uid of the caller
(the notes say so explicitly).

No Django here: this is plain Python used by the environments and the trainers.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

# Dedicated uids are drawn from a range far above any normal account or container subuid range, so a
# collision with a real user (whose processes the reaper would kill) is implausible.
SANDBOX_UID_BASE = 2_000_000_000
SANDBOX_UID_SPAN = 1_000_000

# Directories never hidden: hiding them would break the dynamic loader or the interpreter.
_NEVER_HIDE = {"/", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/dev", "/sys"}
_DEFAULT_HIDE = ["/root", "/home", "/mnt", "/media", "/srv"]
# Replaced by private writable tmpfs in the child; hiding them (or a folder inside) would be pointless,
# and hiding /tmp would also hide the stdlib bind mounts the child imports from.
_PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_STARTUP_GRACE_S = 1.5  # interpreter start + namespace setup, on top of the user's wall budget
_OUTPUT_CAP = 4 * 1024 * 1024  # bytes of child output the parent reads back at most


@dataclass(frozen=True)
class SandboxResult:
    passed: int  # tests whose output came back AND equals the expected value (compared in the parent)
    total: int
    ran: int  # tests whose output actually came back from the child
    error: str | None  # load error / timeout / kill / setup failure; None when every test ran
    notes: list[str] = field(default_factory=list)  # what containment was enforced, what degraded
    failures: list[str] = field(default_factory=list)  # short per-test failure lines (first few)
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def run_tests(
    code: str,
    func_name: str,
    tests: Sequence[tuple[Sequence[Any], Any]],
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_procs: int = 8,
    file_size_mb: int = 16,
    hide_paths: Sequence[str] | None = None,
    python: str = sys.executable,
    max_failures_listed: int = 3,
) -> SandboxResult:
    """Run `code`, call `func_name(*args)` for each hidden test, and score it in this process.

    `tests` are (args, expected) pairs; only the args (JSON) reach the child. Outputs and expected
    values are compared after a JSON round trip (tuples == lists; floats with a small tolerance; bool
    is not int)."""
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    as_root = os.geteuid() == 0
    uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN) if as_root else None
    config = {
        "nonce": nonce,
        "code": code,
        "func_name": func_name,
        "inputs": [list(args) for args, _ in tests],
        "uid": uid,
        "cpu_s": max(1, math.ceil(timeout_s)),
        "memory_bytes": memory_mb * 1024 * 1024,
        "max_procs": max_procs,
        "file_size_bytes": file_size_mb * 1024 * 1024,
        "hide": _hide_list(hide_paths),
    }
    # base is root-only 0700: the child's cwd is base/work, so ".." leads to a place it cannot search.
    base = Path(tempfile.mkdtemp(prefix="sandbox-"))
    timed_out = False
    returncode: int | None = None
    try:
        work = base / "work"
        work.mkdir(mode=0o700)
        if uid is not None:
            os.chown(work, uid, uid)
        (base / "in.json").write_text(json.dumps(config))
        with open(base / "in.json", "rb") as fin, open(base / "out", "wb") as fout, open(base / "err", "wb") as ferr:
            # stdin/stdout/stderr are regular files, not pipes: no deadlock, and the child's output
            # size is capped by its RLIMIT_FSIZE instead of by our memory.
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _HARNESS],
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                cwd=work,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,  # own session + process group, so we can kill the lot
                close_fds=True,
            )
            try:
                returncode = proc.wait(timeout=timeout_s + _STARTUP_GRACE_S)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _reap(proc, uid)
        out = _read_capped(base / "out")
        err = _read_capped(base / "err")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return _verdict(
        out, err, nonce, tests, returncode, timed_out, timeout_s, uid, max_failures_listed, time.monotonic() - t0
    )


def _hide_list(extra: Sequence[str] | None) -> list[str]:
    wanted = list(_DEFAULT_HIDE) + [str(_PROJECT_ROOT), str(_PROJECT_ROOT.parent), os.getcwd()]
    wanted += list(extra or [])
    out: list[str] = []
    for p in wanted:
        p = os.path.realpath(p)
        private = any(p == t or p.startswith(t + "/") or t.startswith(p + "/") for t in _PRIVATE_TMP)
        if p not in _NEVER_HIDE and not private and p not in out and os.path.isdir(p):
            out.append(p)
    return out


def _read_capped(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_OUTPUT_CAP).decode("utf-8", "replace")


def _reap(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the process group, then every process of the sandbox uid (a fork bomb may have called
    setsid() to leave the group; it cannot leave its uid)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        # RLIMIT_NPROC bounds how many there can be; loop because a survivor may fork between passes.
        for _ in range(50):
            pids = _live_pids_of_uid(uid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable only in D state
        pass


def _live_pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = fields.get("Uid", "").split()
        if str(uid) in uids and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _verdict(
    out: str,
    err: str,
    nonce: str,
    tests: Sequence[tuple[Sequence[Any], Any]],
    returncode: int | None,
    timed_out: bool,
    timeout_s: float,
    uid: int | None,
    max_failures_listed: int,
    duration_s: float,
) -> SandboxResult:
    total = len(tests)
    notes: list[str] = []
    cases: dict[int, dict[str, Any]] = {}
    load_error: str | None = None
    setup_ok = done = False
    for line in out.splitlines():
        if not line.startswith(nonce + " "):
            continue  # the user's own prints go to stderr; anything else untagged is noise
        try:
            msg = json.loads(line[len(nonce) + 1 :])
        except ValueError:
            continue
        kind = msg.get("t")
        # Notes and setup status are trusted only before the user code ran (it could forge lines after).
        if kind == "note" and not setup_ok:
            notes.append(str(msg.get("msg")))
        elif kind == "setup_ok" and not setup_ok:
            setup_ok = True
        elif kind == "load_error" and setup_ok and load_error is None:
            load_error = str(msg.get("err"))
        elif kind == "case" and setup_ok:
            i = msg.get("i")
            # First line per index wins. A forged line only carries an output the function could have
            # returned anyway: comparison with the expected value happens here, never in the child.
            if isinstance(i, int) and 0 <= i < total and i not in cases:
                cases[i] = msg
        elif kind == "done" and setup_ok:
            done = True
    if uid is not None:
        notes.append(f"ran as dedicated uid/gid {uid}; all its processes killed afterwards")
    else:
        notes.append("not root: ran as the caller's uid; only the process group is killed afterwards")

    passed = 0
    failures: list[str] = []
    for i, (args, expected) in enumerate(tests):
        msg = cases.get(i)
        if msg is None:
            reason = "no output (did not run)"
        elif not msg.get("ok"):
            reason = f"raised {msg.get('err')}"
        elif _same(msg.get("out"), _normalise(expected)):
            passed += 1
            continue
        else:
            reason = f"returned {_short(msg.get('out'))}, expected {_short(_normalise(expected))}"
        if len(failures) < max_failures_listed:
            failures.append(f"{_short(list(args))}: {reason}")

    error: str | None = None
    if not setup_ok:
        error = f"sandbox setup failed (rc={returncode}): {_tail(err)}"
    elif load_error is not None:
        error = f"code failed to load: {load_error}"
    elif timed_out:
        error = f"timed out after {timeout_s:g}s wall ({len(cases)}/{total} outputs came back)"
    elif returncode is not None and returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (CPU limit)" if sig == signal.SIGXCPU else ""
        error = f"killed by {name}{hint} ({len(cases)}/{total} outputs came back)"
    elif not done or len(cases) < total:
        error = f"exited early with code {returncode} ({len(cases)}/{total} outputs came back)"
    return SandboxResult(
        passed=passed,
        total=total,
        ran=len(cases),
        error=error,
        notes=notes,
        failures=failures,
        timed_out=timed_out,
        duration_s=round(duration_s, 3),
    )


def _normalise(value: Any) -> Any:
    """Expected values go through the same JSON round trip as the child's outputs (tuple -> list)."""
    return json.loads(json.dumps(value))


def _same(a: Any, b: Any) -> bool:
    # bool is a subclass of int in Python; True must not pass for 1 (or vice versa).
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-400:]


# The child harness. Trusted code: it runs as root (when we are root) only until it has entered the
# namespaces, set the rlimits and dropped to the sandbox uid; only then does it read the user's code.
# It is passed with -c so it is not a file the child could find on disk.
_HARNESS = r'''
import sys, os, json, signal, resource
cfg = json.loads(sys.stdin.buffer.read())
sys.stdin.close()
NONCE = cfg["nonce"]
RES = os.dup(1)          # private results channel (a regular file opened by the parent)
os.dup2(2, 1)            # the user's prints go to the stderr capture, never to the results channel
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the file-size limit: EFBIG, not a silent death

def emit(**msg):
    os.write(RES, (NONCE + " " + json.dumps(msg) + "\n").encode())

def note(text):
    emit(t="note", msg=text)

import ctypes, socket, _socket, _posixsubprocess, posix
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18

def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))

def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)

uid = cfg["uid"]
as_root = os.geteuid() == 0
ns_ok = stdlib_bound = False
try:
    if as_root:
        check(libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    else:
        # Unprivileged: a user namespace makes us "root" over new net/mount namespaces only.
        real_uid, real_gid = os.getuid(), os.getgid()
        check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", "%d %d 1" % (real_uid, real_uid)),
                           ("/proc/self/gid_map", "%d %d 1" % (real_gid, real_gid))):
            with open(path, "w") as f:
                f.write(text)
    ns_ok = True
    note("network namespace: new, loopback down (no route anywhere)")
except OSError as exc:
    note("network namespace unavailable: %s; socket creation is stubbed out instead "
         "(defence in depth, not a guarantee)" % exc)
    note("mount namespace unavailable: no filesystem hiding; relying on uid permissions only")

if ns_ok:
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        # /tmp first: the stdlib is bind-mounted inside it, BEFORE hiding the folders that contain it
        # (the interpreter may live under /root, which the sandbox uid cannot read).
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777")
        new_path = []
        for n, entry in enumerate(p for p in sys.path if os.path.isdir(p)):
            target = "/tmp/.py%d" % n
            os.mkdir(target)
            mount(entry, target, None, MS_BIND | MS_REC)
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            new_path.append(target)
        sys.path[:] = new_path
        sys.path_importer_cache.clear()
        stdlib_bound = True
        for d in ("/var/tmp", "/dev/shm", "/run/lock"):
            if os.path.isdir(d):
                mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=1777")
        hidden = []
        for d in cfg["hide"]:
            try:
                mount("tmpfs", d, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
                hidden.append(d)
            except OSError as exc:
                note("could not hide %s: %s" % (d, exc))
        note("mount namespace: private /tmp /var/tmp /dev/shm /run/lock; hidden: %s" % ", ".join(hidden))
    except OSError as exc:
        note("mount namespace setup failed: %s" % exc)

try:
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_bytes"], cfg["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_size_bytes"], cfg["file_size_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_procs"], cfg["max_procs"]))
    note("rlimits: cpu=%ss as=%dMB fsize=%dMB nofile=64 nproc=%d core=0" % (
        cfg["cpu_s"], cfg["memory_bytes"] >> 20, cfg["file_size_bytes"] >> 20, cfg["max_procs"]))
except (OSError, ValueError) as exc:
    note("rlimits failed: %s" % exc)

if uid is not None and not stdlib_bound:
    # The interpreter's stdlib may sit in a folder the sandbox uid cannot read (e.g. /root/.pyenv):
    # import what task code commonly needs while we still can.
    import re, math, collections, itertools, functools, string, datetime, csv, heapq, bisect  # noqa
    import statistics, decimal, fractions, typing, dataclasses, time, random  # noqa
    note("stdlib not bind-mounted: common modules pre-imported; others may be unreadable to the sandbox uid")
if uid is not None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop privileges")
if libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
    note("no_new_privs set")
if os.getuid() != 0:
    note("RLIMIT_NPROC binds (non-root uid)")
else:
    note("still root: RLIMIT_NPROC does not bind")

# Defence in depth only (see the module docstring): the originals can be recovered by a determined
# program; the namespaces, uid and rlimits above are the real fences.
def _blocked(*args, **kwargs):
    raise PermissionError("blocked in the sandbox")
for mod in (os, posix):
    for name in ("fork", "forkpty", "system", "popen", "kill", "killpg", "execv", "execve", "execvp", "execvpe",
                 "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                 "spawnle", "spawnlp", "spawnlpe", "posix_spawn", "posix_spawnp"):
        if hasattr(mod, name):
            setattr(mod, name, _blocked)
_posixsubprocess.fork_exec = _blocked
class _NoSocket:
    def __init__(self, *args, **kwargs):
        raise PermissionError("network access is blocked in the sandbox")
for mod in (socket, _socket):
    for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo"):
        if hasattr(mod, name):
            setattr(mod, name, _NoSocket)
for name in ("ctypes", "_ctypes", "ctypes.util"):
    sys.modules[name] = None
del libc, ctypes
note("stubs: fork/exec/spawn/subprocess/kill/socket/ctypes (defence in depth, bypassable)")
emit(t="setup_ok")

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
    emit(t="load_error", err=("%s: %s" % (type(exc).__name__, exc))[:300])
    os._exit(1)

def jsonable(o):
    return {"__unserializable__": type(o).__name__}

for i, args in enumerate(inputs):
    try:
        out = func(*args)
        try:
            line = json.dumps({"t": "case", "i": i, "ok": True, "out": out}, default=jsonable)
        except BaseException as exc:  # tuple dict keys, cycles, absurd nesting...
            raise TypeError("output is not JSON-serialisable: %s" % exc)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt count as failures of that test
        line = json.dumps({"t": "case", "i": i, "ok": False, "err": ("%s: %s" % (type(exc).__name__, exc))[:200]})
    os.write(RES, (NONCE + " " + line + "\n").encode())
emit(t="done")
os._exit(0)   # skip atexit handlers the user code may have registered
'''
