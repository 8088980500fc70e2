"""Hostile programs against training.sandbox.run_tests, each of which must be contained.

Every program tries one attack and returns "pwned" (or the stolen secret) when it works; the hidden
test expects exactly that, so `passed == 0` means the attack failed (or was never scored). Around
every run we check the machine: this process and its parent are alive, no file appeared outside the
sandbox, no process of the sandbox uid survived, and the run ended within its timeout plus a margin.
The fork/exec/kill/ctypes stubs are bypassed on purpose in several programs (re-imported C modules):
the real fences (uid, rlimits, namespaces) must hold on their own. A table is printed at the end.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from pathlib import Path

import pytest

from training.sandbox import _live_pids_of_uid, run_tests

ROOT = os.geteuid() == 0
TAG = secrets.token_hex(4)
MARKER = f"/tmp/sandbox_pwned_{TAG}"
PROJECT_MARKER = str(Path(__file__).resolve().parents[2] / f"sandbox_pwned_{TAG}")
SECRET = "S3CR3T-" + secrets.token_hex(6)  # a hidden expected value: never sent to the child
MARGIN_S = 4.0  # interpreter start-up, namespace setup and reaping on a loaded 2-core machine
RESULTS: list[tuple[str, str, float]] = []

REIMPORT = "import sys\nfor _m in ('posix', 'os'):\n    sys.modules.pop(_m, None)\nimport posix\n"
CTYPES = "import sys\nfor _m in ('ctypes', '_ctypes', 'ctypes.util'):\n    sys.modules.pop(_m, None)\nimport ctypes\n"


def attempt(body: str, prelude: str = "") -> str:
    """A function `f()` running `body`; any exception means the attack failed ("blocked")."""
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return f"{prelude}\ndef f():\n    try:\n{indented}\n    except BaseException as e:\n        return 'blocked'\n"


PROGRAMS: list[tuple[str, str, float, bool]] = [  # (name, code, timeout_s, needs root)
    ("read /etc/shadow", attempt("return 'pwned' if open('/etc/shadow').read() else ''"), 3, False),
    ("os.setuid(0)", attempt("import os\nos.setuid(0)\nreturn 'pwned' if os.getuid() == 0 else ''"), 3, True),
    ("ptrace the parent (ctypes re-imported)", attempt(
        "import os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "return 'pwned' if libc.ptrace(16, os.getppid(), 0, 0) == 0 else ''", CTYPES), 3, True),
    ("SIGKILL the parent (posix re-imported)", attempt(
        "posix.kill(posix.getppid(), 9)\nreturn 'pwned'", REIMPORT), 3, True),
    # kill(-1) itself succeeds (it reaches the sandbox uid's own processes): pwned only if the parent died.
    ("kill(-1) every process it can see", attempt(
        "ppid = posix.getppid()\nposix.kill(-1, 9)\ntry:\n    posix.kill(ppid, 0)\nexcept ProcessLookupError:\n"
        "    return 'pwned'\nexcept PermissionError:\n    pass\nreturn 'parent alive'", REIMPORT), 3, True),
    ("write a 1 GB file", attempt(
        "with open('big', 'wb') as fh:\n    for _ in range(1024):\n        fh.write(b'x' * (1 << 20))\n"
        "return 'pwned'"), 5, False),
    ("spawn threads in a loop", attempt(
        "import threading, time\nn = 0\nwhile n < 100000:\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n    n += 1\nreturn 'pwned'"),
     3, True),
    ("open fds until it fails", attempt(
        "fds = [open('/dev/null') for _ in range(100000)]\nreturn 'pwned'"), 3, False),
    # system() may well run (the ctypes stub is bypassable by design); what it touches must stay inside:
    # /tmp is the sandbox's private tmpfs, the project folder is hidden, /etc is read-only to the uid.
    ("ctypes: libc system() (re-imported)", attempt(
        f"libc = ctypes.CDLL(None)\nlibc.system(b'touch {MARKER} {PROJECT_MARKER} /etc/pwned_{TAG}')\n"
        "return 'ran'", CTYPES), 3, True),
    ("read /proc/self/environ and the parent's", attempt(
        "import os\nseen = open('/proc/self/environ', 'rb').read()\n"
        "try:\n    seen += open('/proc/%d/environ' % os.getppid(), 'rb').read()\nexcept OSError:\n    pass\n"
        "return 'pwned' if b'SANDBOX_HOSTILE_SECRET' in seen else ''"), 3, False),
    ("forge equality: str subclass, builtins patched", (
        "import builtins\nclass S(str):\n    def __eq__(self, o):\n        return True\n    __hash__ = str.__hash__\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.str = S\n"
        "def f():\n    return S('anything')\n"), 3, False),
    ("sleep past the timeout in a finally block", (
        "import time\ndef f():\n    try:\n        return 'pwned'\n    finally:\n        time.sleep(60)\n"), 1, False),
    ("recursion bomb (limit raised to 10**6)", (
        "import sys\nsys.setrecursionlimit(10**6)\ndef r(n):\n    return r(n + 1)\n"
        "def f():\n    return r(0)\n"), 2, False),
    ("dig the expected value out of the harness (gc, frames, marshal)", (
        "import gc, sys, marshal, pickle\n"
        "def f():\n    for o in gc.get_objects():\n        try:\n"
        "            blob = pickle.dumps(o) if isinstance(o, (dict, list, tuple)) else b''\n"
        "        except Exception:\n            continue\n"
        "        m = __import__('re').search(rb'S3CR3T-[0-9a-f]{12}', blob)\n"
        "        if m:\n            return m.group().decode()\n"
        "    fr = sys._getframe()\n    while fr:\n        for v in fr.f_globals.values():\n"
        "            if isinstance(v, str) and v.startswith('S3CR3T'):\n                return v\n"
        "        fr = fr.f_back\n"
        "    return 'not found'\n"), 3, False),
    ("__import__('posix').fork", attempt("__import__('posix').fork()\nreturn 'pwned'"), 3, False),
    ("fork bomb with setsid escape (posix re-imported)", attempt(
        "import time\nfor _ in range(200):\n    if posix.fork() == 0:\n        posix.setsid()\n"
        "        time.sleep(60)\n        posix._exit(0)\nreturn 'pwned'", REIMPORT), 2, True),
    ("raw socket to a loopback listener (_socket re-imported)", attempt(
        "import sys\nsys.modules.pop('_socket', None)\nimport _socket\ns = _socket.socket()\ns.settimeout(0.5)\n"
        "s.connect(('127.0.0.1', PORT))\nreturn 'pwned'"), 3, False),
    ("write outside its cwd", attempt(
        f"done = []\nfor p in ('{MARKER}', '{PROJECT_MARKER}', '/etc/pwned_{TAG}', '/root/pwned_{TAG}', '../x'):\n"
        "    try:\n        open(p, 'w').write('x'); done.append(p)\n    except OSError:\n        pass\n"
        "return 'pwned' if [p for p in done if not p.startswith('/tmp/')] else 'only its private /tmp'"), 3, True),
    ("allocate 10 GB", attempt("b = bytearray(10 * 1024 ** 3)\nreturn 'pwned'"), 3, False),
    ("spin the CPU forever", "def f():\n    while True:\n        pass\n", 1, False),
    ("exit 0 before the tests run", "import os\nos._exit(0)\ndef f():\n    return 'pwned'\n", 3, False),
    ("unshare/mount via ctypes to regain root", attempt(
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "return 'pwned' if libc.unshare(0x10000000) == 0 and libc.mount(b'none', b'/', b'tmpfs', 0, None) == 0 "
        "else ''", CTYPES), 3, True),
    ("read /proc/kcore and /dev/mem", attempt(
        "for p in ('/proc/kcore', '/dev/mem'):\n    try:\n        if open(p, 'rb').read(16):\n"
        "            return 'pwned'\n    except OSError:\n        pass\nreturn ''"), 3, False),
    ("overwrite /etc/passwd", attempt("open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\\n')\nreturn 'pwned'"),
     3, False),
    # Forging a result line is no more than returning that value: useless without the hidden answer.
    ("print a fake pass and forge result lines", (
        "import __main__, os, json\n"
        "def f():\n    print('OK 1/1 passed')\n"
        "    os.write(__main__.RES, (__main__.NONCE + ' ' + json.dumps({'t': 'case', 'i': 0, 'ok': True, "
        "'out': 'pwned'}) + '\\n').encode())\n    return 'nope'\n"), 3, False),
]


def _uid_of(result) -> int | None:
    for note in result.notes:
        m = re.search(r"dedicated uid/gid (\d+)", note)
        if m:
            return int(m.group(1))
    return None


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(5)
    s.setblocking(False)
    yield s
    s.close()


@pytest.mark.parametrize("name,code,timeout_s,needs_root", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_it_contains_the_hostile_program(name, code, timeout_s, needs_root, listener, monkeypatch):
    if needs_root and not ROOT:
        pytest.skip("this containment (dedicated uid) needs the tests to run as root")
    monkeypatch.setenv("SANDBOX_HOSTILE_SECRET", "leak-me")
    code = code.replace("PORT", str(listener.getsockname()[1]))
    expected = SECRET if "harness" in name or "forge result" in name else "pwned"
    parent = os.getppid()
    t0 = time.monotonic()
    r = run_tests(code, "f", [((), expected)], timeout_s=timeout_s)
    took = time.monotonic() - t0
    outcome = f"passed {r.passed}/{r.total}, ran {r.ran}" + (f"; {r.error[:60]}" if r.error else "") + \
        (f"; {r.failures[0][:50]}" if r.failures and not r.error else "")
    RESULTS.append((name, outcome, took))
    assert r.passed == 0, (name, r)
    assert took < timeout_s + MARGIN_S, f"{name}: took {took:.1f} s"
    os.kill(parent, 0)  # our parent is alive (and so are we)
    for path in (MARKER, PROJECT_MARKER, f"/etc/pwned_{TAG}", f"/root/pwned_{TAG}"):
        assert not os.path.exists(path), f"{name}: wrote {path}"
    uid = _uid_of(r)
    if uid is not None:
        assert _live_pids_of_uid(uid) == [], f"{name}: processes of the sandbox uid survived"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected to the loopback listener


def test_it_prints_the_outcome_table(capsys):
    if not RESULTS:
        pytest.skip("no hostile program ran in this session")
    with capsys.disabled():
        print(f"\n{'hostile program':<62} {'s':>5}  outcome")
        for name, outcome, took in RESULTS:
            print(f"{name:<62} {took:>5.1f}  {outcome}")
    assert len(RESULTS) >= 20
