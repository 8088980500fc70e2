"""The sandbox against hostile snippets: each one must be contained or scored 0.

Every run is a real child process (about 0.1 s each); the few that wait for a limit use a 1 s budget.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import tempfile
import time
from pathlib import Path

import pytest

from training.sandbox import _live_pids_of_uid, _same, run_tests

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = [((1, 2), 3), ((2, 2), 4), (("a", "b"), "ab")]
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0


def _uid_of(result) -> int | None:
    for note in result.notes:
        m = re.search(r"dedicated uid/gid (\d+)", note)
        if m:
            return int(m.group(1))
    return None


def test_it_passes_correct_code():
    r = run_tests(ADD, "add", ADD_TESTS)
    assert (r.passed, r.total, r.ran, r.error) == (3, 3, 3, None)
    assert r.fraction == 1.0


def test_it_scores_partial_passes_and_explains_failures():
    code = "def add(a, b):\n    if a == 2:\n        return 5\n    return a + b\n"
    r = run_tests(code, "add", ADD_TESTS)
    assert (r.passed, r.ran, r.error) == (2, 3, None)
    assert r.failures == ["[2, 2]: returned 5, expected 4"]


def test_it_compares_like_json_but_keeps_bool_apart_from_int():
    assert _same([1, 2], [1, 2]) and _same(0.1 + 0.2, 0.3)
    assert not _same(True, 1) and not _same(1, "1") and not _same([1], [1, 2])


def test_it_records_what_it_enforced():
    r = run_tests(ADD, "add", ADD_TESTS[:1])
    text = " ".join(r.notes)
    assert "rlimits:" in text and "stubs:" in text
    assert "network namespace" in text  # either "new" or an explicit "unavailable: <why>"


def test_it_hides_the_parent_environment(monkeypatch):
    secret = "s3cr3t-" + secrets.token_hex(4)
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret)
    code = (
        "import os\n"
        "def leak():\n"
        "    found = [v for v in os.environ.values() if 's3cr3t' in v]\n"
        "    try:\n"
        "        found.append(open('/proc/%d/environ' % os.getppid(), 'rb').read().decode('latin1'))\n"
        "    except OSError:\n"
        "        pass\n"
        "    return ' '.join(found)\n"
    )
    r = run_tests(code, "leak", [((), "")])
    assert r.ran == 1
    assert r.passed == 1, r.failures  # nothing leaked: the returned string was empty


def test_it_blocks_network_access():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import sys\n"
        "def connect(port):\n"
        "    results = []\n"
        "    import socket\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=0.5).sendall(b'x'); results.append('stub')\n"
        "    except Exception as e:\n"
        "        pass\n"
        # Bypass the stub: a fresh _socket module. The network namespace must still stop it.
        "    del sys.modules['_socket']\n"
        "    import _socket\n"
        "    try:\n"
        "        s = _socket.socket(); s.settimeout(0.5); s.connect(('127.0.0.1', port)); results.append('raw')\n"
        "    except Exception as e:\n"
        "        pass\n"
        "    return results\n"
    )
    try:
        r = run_tests(code, "connect", [((port,), ["stub", "raw"])])
        assert r.ran == 1 and r.passed == 0
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()


@pytest.mark.skipif(not ROOT, reason="fork containment by dedicated uid needs root")
def test_it_contains_a_fork_bomb():
    # The stub on os.fork is bypassed on purpose (fresh posix module): RLIMIT_NPROC on the dedicated
    # uid bounds the bomb, the wall timeout stops it and the reaper kills every process of the uid.
    code = (
        "import sys\n"
        "del sys.modules['posix']\n"
        "import posix\n"
        "def bomb():\n"
        "    while True:\n"
        "        try:\n"
        "            posix.fork()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    t0 = time.monotonic()
    r = run_tests(code, "bomb", [((), 0)], timeout_s=1)
    assert time.monotonic() - t0 < 6
    assert r.passed == 0 and r.error
    uid = _uid_of(r)
    assert uid is not None and _live_pids_of_uid(uid) == []


def test_it_blocks_the_plain_fork_and_subprocess_entry_points():
    code = (
        "import os, subprocess\n"
        "def spawn():\n"
        "    out = []\n"
        "    for attempt in (os.fork, lambda: subprocess.run(['true']), lambda: os.system('true')):\n"
        "        try:\n"
        "            attempt(); out.append('ran')\n"
        "        except Exception as e:\n"
        "            out.append(type(e).__name__)\n"
        "    return out\n"
    )
    r = run_tests(code, "spawn", [((), ["PermissionError"] * 3)])
    assert r.passed == 1, r.failures


@pytest.mark.skipif(not ROOT, reason="the mount namespace and dedicated uid need root here")
def test_it_cannot_write_outside_its_working_directory():
    tag = secrets.token_hex(4)
    targets = [f"/tmp/pwned_{tag}", f"/var/tmp/pwned_{tag}", f"/dev/shm/pwned_{tag}"]
    targets.append(str(PROJECT_ROOT / f"pwned_{tag}"))
    code = (
        "def write(paths):\n"
        "    ok = []\n"
        "    for p in paths + ['../pwned_%s', '../../pwned_%s']:\n"
        "        try:\n"
        "            open(p, 'w').write('x'); ok.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    open('inside.txt', 'w').write('fine')  # its own cwd is writable\n"
        "    return ok\n"
    ) % (tag, tag)
    r = run_tests(code, "write", [((targets,), [])])
    assert r.ran == 1
    for path in targets + [f"/tmp/pwned_{tag}"]:
        assert not os.path.exists(path), path
    assert not list(Path(tempfile.gettempdir()).glob(f"**/pwned_{tag}"))


def test_it_removes_its_working_directory():
    before = set(Path(tempfile.gettempdir()).glob("sandbox-*"))
    run_tests("open('left.txt', 'w').write('x')\ndef f():\n    return 1\n", "f", [((), 1)])
    assert set(Path(tempfile.gettempdir()).glob("sandbox-*")) <= before


def test_it_scores_a_huge_allocation_as_zero():
    code = "def grab():\n    return len(bytearray(10 * 1024 ** 3))\n"
    r = run_tests(code, "grab", [((), 10 * 1024**3)])
    assert r.passed == 0
    assert "MemoryError" in r.failures[0]


def test_it_times_out_an_infinite_loop():
    t0 = time.monotonic()
    r = run_tests("def spin():\n    while True:\n        pass\n", "spin", [((), 1)], timeout_s=1)
    assert time.monotonic() - t0 < 4
    assert r.passed == 0 and r.ran == 0
    assert "CPU limit" in r.error or "timed out" in r.error


def test_it_keeps_outputs_computed_before_a_timeout():
    code = "import time\ndef f(x):\n    if x == 2:\n        time.sleep(60)\n    return x\n"
    r = run_tests(code, "f", [((1,), 1), ((2,), 2), ((3,), 3)], timeout_s=1)
    assert (r.passed, r.ran, r.timed_out) == (1, 1, True)


def test_it_cannot_forge_a_pass_by_patching_the_runner():
    # The harness lives in __main__: the code finds the nonce and the results fd, writes "passing"
    # lines for every test, patches json.dumps and returns an object equal to everything.
    code = (
        "import __main__, json, os\n"
        "def forge(msg):\n"
        "    os.write(__main__.RES, (__main__.NONCE + ' ' + json.dumps(msg) + '\\n').encode())\n"
        "for i in range(3):\n"
        "    forge({'t': 'case', 'i': i, 'ok': True, 'out': 'PASS'})\n"
        "forge({'t': 'done'})\n"
        "class Eq:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "json.dumps = lambda *a, **k: '{\"t\": \"case\", \"ok\": true, \"passed\": true}'\n"
        "def add(a, b):\n"
        "    return Eq()\n"
    )
    r = run_tests(code, "add", ADD_TESTS)
    assert r.passed == 0


def test_it_ignores_a_printed_fake_pass():
    code = (
        "print('OK: 3/3 tests passed')\n"
        "print('{\"t\": \"case\", \"i\": 0, \"ok\": true, \"out\": 3}')\n"
        "def add(a, b):\n"
        "    return None\n"
    )
    r = run_tests(code, "add", ADD_TESTS)
    assert (r.passed, r.ran) == (0, 3)


def test_it_fails_code_that_exits_zero_before_the_tests():
    r = run_tests("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", "add", ADD_TESTS)
    assert (r.passed, r.ran) == (0, 0)
    assert "failed to load" in r.error
    r = run_tests("import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n", "add", ADD_TESTS)
    assert (r.passed, r.ran) == (0, 0)


def test_it_counts_tests_after_an_exit_mid_run_as_failed():
    code = "import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n"
    r = run_tests(code, "add", ADD_TESTS)
    assert (r.passed, r.ran) == (1, 1)
    assert "exited early" in r.error


@pytest.mark.skipif(not ROOT, reason="the mount namespace needs root here")
def test_it_cannot_import_the_hidden_tests():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        "def peek():\n"
        "    found = []\n"
        "    try:\n"
        "        import training.environments.ask_to_code_tasks as t; found.append('module')\n"
        "    except Exception:\n"
        "        pass\n"
        "    try:\n"
        f"        open({str(PROJECT_ROOT / 'training' / 'sandbox.py')!r}).read(); found.append('file')\n"
        "    except Exception:\n"
        "        pass\n"
        "    return found\n"
    )
    r = run_tests(code, "peek", [((), [])])
    assert r.passed == 1, r.failures


def test_it_reports_code_that_does_not_define_the_function():
    r = run_tests("def other():\n    pass\n", "add", ADD_TESTS)
    assert r.passed == 0 and "not defined" in r.error
    r = run_tests("def add(a, b) return a", "add", ADD_TESTS)
    assert r.passed == 0 and "SyntaxError" in r.error
