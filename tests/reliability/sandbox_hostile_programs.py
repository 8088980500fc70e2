"""Hostile programs for training.sandbox.run_tests: a plain module (no pytest, no Django) so that
the non-root driver, an interpreter dropped to an unprivileged uid, can load it by path.

Each program defines `f()` and tries one attack; it returns "pwned" (or the stolen secret) only when
the attack worked, and the hidden test expects exactly that, so a pass means an escape. `@NAME@`
tokens are filled in by `render` from the context the test builds on the host (a TCP listener, a
Unix socket, a key in the session keyring, a process with a secret on its command line...).
Several programs bypass the harness's Python-level stubs on purpose (re-imported C modules, ctypes):
the real fences (namespaces, seccomp, read-only minimal root, limits) must hold on their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Program:
    name: str
    code: str
    timeout_s: float = 3.0
    expect: str = (
        "pwned"  # "SECRET": the hidden expected value is a secret the child never receives
    )
    area: str = "escape"  # what it attacks: escape, resources, channel, forgery


REIMPORT = "import sys\nfor _m in ('posix', 'os'):\n    sys.modules.pop(_m, None)\nimport posix\n"
CTYPES = (
    "import sys\nfor _m in ('ctypes', '_ctypes', 'ctypes.util'):\n    sys.modules.pop(_m, "
    "None)\nimport ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
)
SOCKETS = "import sys\nsys.modules.pop('_socket', None)\nimport _socket\n"


def attempt(body: str, prelude: str = "") -> str:
    """A function `f()` running `body`; any exception means the attack failed ("blocked")."""
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return (
        f"{prelude}\ndef f():\n    try:\n{indented}\n    except BaseException as e:\n        "
        "return 'blocked'\n"
    )


def render(code: str, ctx: dict[str, object]) -> str:
    for key, value in ctx.items():
        code = code.replace(f"@{key}@", str(value))
    return code


# Writes to the results channel (fd RES of the harness in __main__) the way a forger would.
CHANNEL = "import __main__, os\nRES = __main__.RES\n"

PROGRAMS: list[Program] = [
    # --- the original 25 (tests/reliability/test_sandbox_hostile.py before bubblewrap)
    Program("read /etc/shadow", attempt("return 'pwned' if open('/etc/shadow').read() else ''")),
    Program(
        "os.setuid(0)",
        attempt("import os\nos.setuid(0)\nreturn 'pwned' if os.getuid() == 0 else ''"),
    ),
    Program(
        "ptrace the parent (ctypes re-imported)",
        attempt(
            "import os\nreturn 'pwned' if libc.ptrace(16, os.getppid(), 0, 0) == 0 else ''", CTYPES
        ),
    ),
    # The sandbox init (pid 1 of its namespace) ignores signals from inside; pwned only if it died.
    Program(
        "SIGKILL the parent (posix re-imported)",
        attempt(
            "import time\nppid = posix.getppid()\nposix.kill(ppid, 9)\ntime.sleep(0.2)\n"
            "return 'pwned' if posix.getppid() != ppid else 'parent alive'",
            REIMPORT,
        ),
    ),
    Program(
        "kill(-1) every process it can see",
        attempt(
            "ppid = posix.getppid()\nposix.kill(-1, 9)\ntry:\n    posix.kill(ppid, 0)\nexcept "
            "ProcessLookupError:\n    return 'pwned'\nreturn 'parent alive'",
            REIMPORT,
        ),
    ),
    Program(
        "write a 1 GB file",
        attempt(
            "with open('big', 'wb') as fh:\n    for _ in range(1024):\n        fh.write(b'x' * (1 "
            "<< 20))\nreturn 'pwned'"
        ),
        5,
        area="resources",
    ),
    Program(
        "spawn threads in a loop",
        attempt(
            "import threading, time\nn = 0\nwhile n < 100000:\n"
            "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n    n += "
            "1\nreturn 'pwned'"
        ),
        area="resources",
    ),
    Program(
        "open fds until it fails",
        attempt("fds = [open('/dev/null') for _ in range(100000)]\nreturn 'pwned'"),
        area="resources",
    ),
    Program(
        "ctypes: libc system() (re-imported)",
        attempt(
            "libc.system(b'touch @MARKER@ @PROJECT_MARKER@ /etc/pwned_@TAG@')\nreturn 'ran'", CTYPES
        ),
    ),
    Program(
        "read /proc/self/environ and the parent's",
        attempt(
            "import os\nseen = open('/proc/self/environ', 'rb').read()\n"
            "try:\n    seen += open('/proc/%d/environ' % os.getppid(), 'rb').read()\nexcept "
            "OSError:\n    pass\nreturn 'pwned' if b'SANDBOX_HOSTILE_SECRET' in seen else ''"
        ),
    ),
    Program(
        "forge equality: str subclass, builtins patched",
        (
            "import builtins\nclass S(str):\n    def __eq__(self, o):\n        return True\n    "
            "__hash__ = str.__hash__\nbuiltins.isinstance = lambda *a: True\nbuiltins.str = S\n"
            "def f():\n    return S('anything')\n"
        ),
        area="forgery",
    ),
    Program(
        "sleep past the timeout in a finally block",
        (
            "import time\ndef f():\n    try:\n        return 'pwned'\n    finally:\n        "
            "time.sleep(60)\n"
        ),
        1,
        area="resources",
    ),
    Program(
        "recursion bomb (limit raised to 10**6)",
        (
            "import sys\nsys.setrecursionlimit(10**6)\ndef r(n):\n    return r(n + 1)\n"
            "def f():\n    return r(0)\n"
        ),
        2,
        area="resources",
    ),
    Program(
        "dig the expected value out of the harness (gc, frames, marshal)",
        (
            "import gc, sys, pickle\n"
            "def f():\n    for o in gc.get_objects():\n        try:\n"
            "            blob = pickle.dumps(o) if isinstance(o, (dict, list, tuple)) else b''\n"
            "        except Exception:\n            continue\n"
            "        m = __import__('re').search(rb'S3CR3T-[0-9a-f]{12}', blob)\n"
            "        if m:\n            return m.group().decode()\n"
            "    fr = sys._getframe()\n    while fr:\n        for v in fr.f_globals.values():\n"
            "            if isinstance(v, str) and v.startswith('S3CR3T'):\n                return "
            "v\n        fr = fr.f_back\n"
            "    return 'not found'\n"
        ),
        expect="SECRET",
        area="forgery",
    ),
    Program("__import__('posix').fork", attempt("__import__('posix').fork()\nreturn 'pwned'")),
    Program(
        "fork bomb with setsid escape (posix re-imported)",
        attempt(
            "import time\nfor _ in range(200):\n    if posix.fork() == 0:\n        posix.setsid()\n"
            "        time.sleep(60)\n        posix._exit(0)\nreturn 'pwned'",
            REIMPORT,
        ),
        2,
        area="resources",
    ),
    Program(
        "raw socket to a loopback listener (_socket re-imported)",
        attempt(
            "s = _socket.socket()\ns.settimeout(0.5)\ns.connect(('127.0.0.1', @PORT@))\nreturn "
            "'pwned'",
            SOCKETS,
        ),
    ),
    Program(
        "write outside its cwd",
        attempt(
            "done = []\nfor p in ('@MARKER@', '@PROJECT_MARKER@', '/etc/pwned_@TAG@', "
            "'/root/pwned_@TAG@', '../x'):\n    try:\n        open(p, 'w').write('x'); "
            "done.append(p)\n    except OSError:\n        pass\nreturn 'pwned' if [p for p in done "
            "if not p.startswith('/tmp/')] else 'only its private /tmp'"
        ),
    ),
    Program(
        "allocate 10 GB", attempt("b = bytearray(10 * 1024 ** 3)\nreturn 'pwned'"), area="resources"
    ),
    Program(
        "spin the CPU forever", "def f():\n    while True:\n        pass\n", 1, area="resources"
    ),
    Program(
        "exit 0 before the tests run",
        "import os\nos._exit(0)\ndef f():\n    return 'pwned'\n",
        area="forgery",
    ),
    Program(
        "unshare/mount via ctypes to regain root",
        attempt(
            "return 'pwned' if libc.unshare(0x10000000) == 0 and libc.mount(b'none', b'/', "
            "b'tmpfs', 0, None) == 0 else ''",
            CTYPES,
        ),
    ),
    Program(
        "read /proc/kcore and /dev/mem",
        attempt(
            "for p in ('/proc/kcore', '/dev/mem'):\n    try:\n        if open(p, 'rb').read(16):\n"
            "            return 'pwned'\n    except OSError:\n        pass\nreturn ''"
        ),
    ),
    Program(
        "overwrite /etc/passwd",
        attempt("open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\\n')\nreturn 'pwned'"),
    ),
    Program(
        "print a fake pass and forge result lines",
        (
            CHANNEL + "import json\n"
            "def f():\n    print('OK 1/1 passed')\n"
            "    os.write(RES, (json.dumps({'t': 'case', 'i': 0, 'ok': True, 'out': 'pwned'}) + "
            "'\\n').encode())\n    return 'nope'\n"
        ),
        expect="SECRET",
        area="channel",
    ),
    # --- host Unix sockets: path-named sockets ignore the network namespace; only the
    # root hides them
    Program(
        "connect to the Postgres Unix socket",
        attempt(
            "s = _socket.socket(_socket.AF_UNIX)\n"
            "s.connect('/run/postgresql/.s.PGSQL.5432')\nreturn 'pwned'",
            SOCKETS,
        ),
    ),
    Program(
        "connect to the MariaDB Unix socket",
        attempt(
            "s = _socket.socket(_socket.AF_UNIX)\ns.connect('/run/mysqld/mysqld.sock')\nreturn "
            "'pwned'",
            SOCKETS,
        ),
    ),
    Program(
        "connect to a host Unix socket by path",
        attempt(
            "s = _socket.socket(_socket.AF_UNIX)\ns.connect('@UNIX_PATH@')\nreturn 'pwned'", SOCKETS
        ),
    ),
    Program(
        "connect to a host abstract Unix socket",
        attempt(
            "s = _socket.socket(_socket.AF_UNIX)\ns.connect('\\0@ABSTRACT@')\nreturn 'pwned'",
            SOCKETS,
        ),
    ),
    Program(
        "find any socket file on the visible filesystem",
        attempt(
            "import os, stat\nfor top in ('/run', '/var', '/tmp', '/sandbox', '/python'):\n"
            "    for d, _, files in os.walk(top):\n        for n in files:\n"
            "            if stat.S_ISSOCK(os.lstat(os.path.join(d, n)).st_mode):\n                "
            "return 'pwned'\nreturn 'none'"
        ),
    ),
    # --- other checkouts of the project and host folders
    Program(
        "read the task bank through another checkout",
        attempt(
            "import glob\nbank = 'training/environments/ask_to_code/tasks.json'\n"
            "for p in glob.glob('/work/*/' + bank) + ['@PROJECT@/' + bank]:\n    try:\n"
            "        if open(p).read():\n            return 'pwned'\n    except OSError:\n        "
            "pass\nreturn 'none'"
        ),
    ),
    Program(
        "list /work, /root, /home, /var, /run, /etc",
        attempt(
            "import os\nfor d in ('/work', '/root', '/home', '/var', '/run', '/etc', '/usr', "
            "'/srv', '/mnt'):\n    if os.path.exists(d):\n        return 'pwned'\nreturn 'none'"
        ),
    ),
    Program(
        "census of the root: anything beyond the runtime and its tmpfs",
        attempt(
            "import os\nallowed = ('/python', '/lib64', '/sandbox', '/tmp', '/proc', '/dev')\n"
            "if sorted(os.listdir('/')) != sorted(a[1:] for a in allowed):\n    return 'pwned'\n"
            "for d, dirs, files in os.walk('/python'):\n"
            "    if 'site-packages' in d and files:\n        return 'pwned'\nreturn 'minimal'"
        ),
    ),
    Program(
        "reach the host through /proc/1/root and /proc/self/cwd",
        attempt(
            "import os\nfor p in ('/proc/1/root/work', '/proc/1/root/etc/passwd', "
            "'/proc/self/root/root'):\n    if os.path.exists(p):\n        return 'pwned'\nreturn "
            "'none'"
        ),
    ),
    # --- results channel: forgery, truncation, malformed lines; each must void the run,
    # not crash it
    Program(
        "channel: truncate it and exit (was NaN: 'sandbox setup failed')",
        CHANNEL + "def f():\n    os.ftruncate(RES, 0)\n    os._exit(0)\n",
        area="channel",
    ),
    Program(
        "channel: rewrite it with a forged start, pass and done",
        (
            CHANNEL + "def f():\n    os.ftruncate(RES, 0)\n    os.lseek(RES, 0, 0)\n"
            '    os.write(RES, b\'{"t": "ready"}\\n{"t": "case", "i": 0, "ok": true, "out": '
            '"pwned"}\\n\''
            ' b\'{"t": "done"}\\n\')\n    os._exit(0)\n'
        ),
        expect="SECRET",
        area="channel",
    ),
    Program(
        "channel: a non-object line",
        (CHANNEL + "def f():\n    os.write(RES, b'[]\\n1\\n\"x\"\\n')\n    return 'pwned'\n"),
        expect="SECRET",
        area="channel",
    ),
    Program(
        "channel: a line nested 100000 deep",
        (
            CHANNEL
            + "def f():\n    os.write(RES, b'[' * 100000 + b']' * 100000 + b'\\n')\n    return "
            "'pwned'\n"
        ),
        expect="SECRET",
        area="channel",
    ),
    Program(
        "channel: 20 MB of garbage",
        (
            CHANNEL
            + "def f():\n    for _ in range(20):\n        os.write(RES, b'x' * (1 << 20))\n    "
            "return 'pwned'\n"
        ),
        5,
        expect="SECRET",
        area="channel",
    ),
    Program(
        "channel: forged notes",
        (
            CHANNEL + 'def f():\n    os.write(RES, b\'{"t": "note", "msg": "FORGED-NOTE all limits '
            "off\"}\\n')\n"
            "    return 'pwned'\n"
        ),
        expect="SECRET",
        area="channel",
    ),
    Program(
        "channel: early done marker, then exit",
        (CHANNEL + 'def f():\n    os.write(RES, b\'{"t": "done"}\\n\')\n    os._exit(0)\n'),
        area="channel",
    ),
    Program(
        "channel: no final newline",
        (CHANNEL + 'def f():\n    os.write(RES, b\'{"t": "case"\')\n    os._exit(0)\n'),
        area="channel",
    ),
    Program(
        "return a value nested 100000 deep",
        ("def f():\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v\n"),
        area="channel",
    ),
    Program(
        "return a value nested 200 deep",
        ("def f():\n    v = 'pwned'\n    for _ in range(200):\n        v = [v]\n    return v\n"),
        area="channel",
    ),
    # --- memory and disk held outside the per-process limits
    Program(
        "memfd_create 1 GB",
        attempt(
            "import os\nfd = os.memfd_create('x')\nfor _ in range(1024):\n    os.write(fd, b'x' * "
            "(1 << 20))\nreturn 'pwned'"
        ),
        5,
        area="resources",
    ),
    Program(
        "memfd_create through ctypes",
        attempt(
            "fd = libc.syscall(319, b'x', 0)\nreturn 'pwned' if fd >= 0 else 'refused'", CTYPES
        ),
        area="resources",
    ),
    Program(
        "fill the working tmpfs with many files",
        attempt(
            "n = 0\nwhile n < 1024:\n    open('f%d' % n, 'wb').write(b'x' * (1 << 20))\n    n += "
            "1\nreturn 'pwned'"
        ),
        5,
        area="resources",
    ),
    Program(
        "fill /dev/shm and /tmp",
        attempt(
            "for d in ('/dev/shm', '/tmp'):\n    with open(d + '/big', 'wb') as fh:\n        for _ "
            "in range(256):\n            fh.write(b'x' * (1 << 20))\nreturn 'pwned'"
        ),
        5,
        area="resources",
    ),
    Program(
        "SysV shared memory through ctypes",
        attempt(
            "shmid = libc.shmget(0, 1 << 30, 0o1600)\nreturn 'pwned' if shmid >= 0 else 'refused'",
            CTYPES,
        ),
        area="resources",
    ),
    Program(
        "directories nested thousands deep",
        (
            "import os\ndef f():\n    for _ in range(5000):\n        os.mkdir('d')\n        "
            "os.chdir('d')\n    return 'deep'\n"
        ),
        5,
        area="resources",
    ),
    # --- processes: fork-setsid-exit loops and raw clone
    Program(
        "fork-setsid-exit loop (posix re-imported)",
        attempt(
            "for _ in range(500):\n    if posix.fork() != 0:\n        posix._exit(0)\n    "
            "posix.setsid()\nreturn 'pwned'",
            REIMPORT,
        ),
        2,
        area="resources",
    ),
    Program(
        "raw clone syscall without CLONE_THREAD (ctypes)",
        attempt(
            "pid = libc.syscall(56, 17, 0, 0, 0, 0)\nif pid == 0:\n    import time\n    "
            "time.sleep(60)\nreturn 'pwned' if pid > 0 else 'refused'",
            CTYPES,
        ),
        2,
        area="resources",
    ),
    # --- keyrings, other processes, capabilities, signals
    Program(
        "read a key from the parent's session keyring",
        attempt(
            "kid = libc.syscall(250, 10, -3, b'user', b'@KEY_DESC@', 0)\nif kid < 0:\n    return "
            "'refused'\nbuf = ctypes.create_string_buffer(256)\nn = libc.syscall(250, 11, kid, "
            "buf, 256)\nreturn buf.raw[:max(n, 0)].decode()",
            CTYPES,
        ),
        expect="SECRET",
    ),
    Program(
        "list /proc/keys",
        attempt("return 'pwned' if '@KEY_DESC@' in open('/proc/keys').read() else 'none'"),
    ),
    Program(
        "read other processes' command lines",
        attempt(
            "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
            "            if b'@CMDLINE_SECRET@' in open('/proc/%s/cmdline' % p, 'rb').read():\n"
            "                return 'pwned'\n        except OSError:\n            pass\nreturn "
            "'none'"
        ),
    ),
    Program(
        "count the processes it can see",
        attempt(
            "import os\nreturn 'pwned' if len([p for p in os.listdir('/proc') if p.isdigit()]) > 2 "
            "else 'alone'"
        ),
    ),
    Program(
        "unmount the read-only runtime (ctypes)",
        attempt(
            "return 'pwned' if libc.umount2(b'/python', 2) == 0 or libc.umount2(b'/proc', 2) == 0 "
            "else 'refused'",
            CTYPES,
        ),
    ),
    Program(
        "capabilities in its user namespace",
        attempt(
            "caps = [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', "
            "'CapBnd'))]\nreturn 'pwned' if any(int(l.split()[1], 16) for l in caps) else 'none'"
        ),
    ),
    Program(
        "remount /sandbox elsewhere and write the root (ctypes)",
        attempt(
            "ok = libc.mount(b'/sandbox', b'/python', None, 4096, None) == 0\n"
            "ok = ok or libc.mount(None, b'/', None, 32 | 4096, None) == 0\nopen('/pwned', "
            "'w')\nreturn 'pwned'",
            CTYPES,
        ),
    ),
    Program(
        "a nested user namespace by clone (ctypes)",
        attempt(
            "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\nif pid == 0:\n    libc._exit(0)\n"
            "return 'pwned' if pid > 0 else 'refused'",
            CTYPES,
        ),
    ),
    # Harmless even where it escapes: it writes back the value it read, and
    # only opens sysrq-trigger.
    Program(
        "write a kernel sysctl and open /proc/sysrq-trigger",
        attempt(
            "same = open('/proc/sys/kernel/core_pattern').read()\n"
            "for path, text in (('/proc/sys/kernel/core_pattern', same), ('/proc/sysrq-trigger', "
            "'')):\n    try:\n        with open(path, 'w') as fh:\n            "
            "fh.write(text)\n        return 'pwned'\n    except OSError:\n        pass\nreturn "
            "'refused'"
        ),
    ),
    Program(
        "kill the parent by its host pid",
        attempt("posix.kill(@PARENT_PID@, 9)\nreturn 'pwned'", REIMPORT),
    ),
    Program(
        "signal a host process (ctypes, pidfd too)",
        attempt(
            "hit = libc.kill(@SLEEPER_PID@, 9) == 0\nfd = libc.syscall(434, @SLEEPER_PID@, 0)\n"
            "hit = hit or (fd >= 0 and libc.syscall(424, fd, 9, None, 0) == 0)\nreturn 'pwned' if "
            "hit else 'refused'",
            CTYPES,
        ),
    ),
    Program(
        "io_uring, bpf and perf_event_open (ctypes)",
        attempt(
            "buf = ctypes.create_string_buffer(256)\n"
            "fds = [libc.syscall(425, 8, buf), libc.syscall(321, 0, buf, 48), libc.syscall(298, "
            "buf, 0, -1, -1, 0)]\nreturn 'pwned' if any(fd >= 0 for fd in fds) else 'refused'",
            CTYPES,
        ),
    ),
]
