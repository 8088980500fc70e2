"""The sandbox on ordinary and careless code, its verdict rules and its results-channel parser.

Every run is a real bubblewrap sandbox (about 0.1-0.3 s each); the few that wait for a limit use a 1
s budget. The hostile programs live in tests/reliability/test_sandbox_hostile.py.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import pytest

from training import sandbox
from training.environments import ask_to_code as atc
from training.sandbox import _same, parse_channel, run_tests, seccomp_program

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = [((1, 2), 3), ((2, 2), 4), (("a", "b"), "ab")]
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0


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
    assert (
        "bubblewrap" in text
        and "namespaces" in text
        and "seccomp:" in text
        and "rlimits per process" in text
    )
    assert (
        "limits: cgroup v1 per run" in text or "limits: no cgroup (" in text
    )  # either way, said explicitly
    if ROOT:
        assert "never as root" in text


def test_it_hides_the_parent_environment(monkeypatch):
    secret = "s3cr3t-" + secrets.token_hex(4)
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret)
    code = (
        "import os\n"
        "def leak():\n"
        "    found = [v for v in os.environ.values() if 's3cr3t' in v]\n"
        "    try:\n"
        "        parent = open('/proc/%d/environ' % os.getppid(), 'rb').read().decode('latin1')\n"
        "        found += [parent] if 's3cr3t' in parent else []\n"
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
        "        socket.create_connection(('127.0.0.1', port), timeout=0.5).sendall(b'x'); "
        "results.append('stub')\n    except Exception as e:\n"
        "        pass\n"
        # Bypass the stub: a fresh _socket module. The network namespace must still stop it.
        "    del sys.modules['_socket']\n"
        "    import _socket\n"
        "    try:\n"
        "        s = _socket.socket(); s.settimeout(0.5); s.connect(('127.0.0.1', port)); "
        "results.append('raw')\n    except Exception as e:\n"
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


def test_it_contains_a_fork_bomb():
    # The stub on os.fork is bypassed on purpose (fresh posix module): seccomp refuses fork itself.
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
    assert r.passed == 0 and (r.error or r.failures)
    assert "every sandbox process was gone after the run" in r.notes


def test_it_blocks_the_plain_fork_and_subprocess_entry_points():
    code = (
        "import os, subprocess\n"
        "def spawn():\n"
        "    out = []\n"
        "    for attempt in (os.fork, lambda: subprocess.run(['true']), lambda: "
        "os.system('true')):\n        try:\n"
        "            attempt(); out.append('ran')\n"
        "        except Exception as e:\n"
        "            out.append(type(e).__name__)\n"
        "    return out\n"
    )
    r = run_tests(code, "spawn", [((), ["PermissionError"] * 3)])
    assert r.passed == 1, r.failures


def test_it_cannot_write_outside_its_working_directory():
    tag = secrets.token_hex(4)
    targets = [f"/tmp/pwned_{tag}", f"/var/tmp/pwned_{tag}", f"/dev/shm/pwned_{tag}"]
    targets.append(str(PROJECT_ROOT / f"pwned_{tag}"))
    code = (
        "def write(paths):\n"
        "    ok = []\n"
        f"    for p in paths + ['../pwned_{tag}', '../../pwned_{tag}']:\n"
        "        try:\n"
        "            open(p, 'w').write('x'); ok.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    open('inside.txt', 'w').write('fine')  # its own cwd is writable\n"
        "    return ok\n"
    )
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
        'json.dumps = lambda *a, **k: \'{"t": "case", "ok": true, "passed": true}\'\n'
        "def add(a, b):\n"
        "    return Eq()\n"
    )
    r = run_tests(code, "add", ADD_TESTS)
    assert r.passed == 0


def test_it_ignores_a_printed_fake_pass():
    code = (
        "print('OK: 3/3 tests passed')\n"
        'print(\'{"t": "case", "i": 0, "ok": true, "out": 3}\')\n'
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


def test_it_cannot_import_the_hidden_tests():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        "def peek():\n"
        "    found = []\n"
        "    try:\n"
        "        import training.environments.ask_to_code.tasks as t; found.append('module')\n"
        "    except Exception:\n"
        "        pass\n"
        "    try:\n"
        f"        open({str(PROJECT_ROOT / 'training' / 'sandbox.py')!r}).read(); "
        "found.append('file')\n    except Exception:\n"
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


# ---------------------------------------------------------------------------------------------
# Failing closed: no bubblewrap, a harness bug, and the environment's reward on top


def test_it_refuses_to_run_without_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap anywhere on it
    r = run_tests(ADD, "add", ADD_TESTS)
    assert (r.passed, r.ran, r.fraction) == (0, 0, 0.0)
    assert r.error.startswith("sandbox unavailable: bubblewrap not installed")


def test_it_refuses_a_bubblewrap_too_old_to_size_its_tmpfs(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho bubblewrap 0.6.1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run_tests(ADD, "add", ADD_TESTS)
    assert (r.passed, r.fraction) == (0, 0.0)
    assert r.error == "sandbox unavailable: bubblewrap >= 0.8.0 needed, found 'bubblewrap 0.6.1'"


def test_it_scores_a_harness_bug_as_a_failure_instead_of_raising(monkeypatch):
    def broken(exe):
        raise RuntimeError("ldd exploded")

    monkeypatch.setattr(sandbox, "_runtime", broken)
    r = run_tests(ADD, "add", ADD_TESTS)
    assert (r.passed, r.fraction) == (0, 0.0)
    assert r.error == "sandbox error: RuntimeError: ldd exploded"


def test_it_refuses_an_interpreter_that_does_not_exist():
    r = run_tests(ADD, "add", ADD_TESTS, python="/nonexistent/python3")
    assert r.passed == 0 and r.error.startswith("sandbox unavailable: interpreter")


@pytest.mark.parametrize(
    "code,reason",
    [
        (
            "import __main__, os\ndef add(a, b):\n    os.ftruncate(__main__.RES, 0)\n    "
            "os._exit(0)\n",
            "results channel",
        ),
        (
            "import __main__, os\ndef add(a, b):\n    os.write(__main__.RES, b'[]\\n')\n    return "
            "a + b\n",
            "not a JSON object",
        ),
        ("import time\ndef add(a, b):\n    time.sleep(60)\n", "timed out"),
        ("def add(a, b) return a", "SyntaxError"),
    ],
    ids=["truncated channel", "non-object line", "timeout", "syntax error"],
)
def test_it_gives_the_environment_a_zero_with_the_reason_never_nan(code, reason):
    atc.clear_cache()
    prompt = atc.task_prompt(atc.TASKS_BY_KEY["safe_div"])
    message = f"```python\n{code.replace('add', 'safe_div')}```"
    transcript = [*prompt.messages, {"role": "assistant", "content": message}]
    score = atc.correctness(prompt, transcript)
    assert score.value == 0.0 and not math.isnan(score.value)
    assert reason in score.reason and "0/4 hidden tests passed" in score.reason


def test_it_counts_correct_outputs_the_parent_compared_even_with_a_timeout_later():
    code = "import time\ndef f(x):\n    if x == 3:\n        time.sleep(60)\n    return x\n"
    r = run_tests(code, "f", [((1,), 1), ((2,), 2), ((3,), 3)], timeout_s=1)
    assert (r.passed, r.ran, r.fraction) == (2, 2, 2 / 3) and r.error.startswith("timed out")


# ---------------------------------------------------------------------------------------------
# The results-channel parser on its own (the hostile suite drives it through real sandboxes)


def _lines(*msgs) -> bytes:
    return "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in msgs).encode()


READY, DONE = {"t": "ready"}, {"t": "done"}


def _case(i, out="x"):
    return {"t": "case", "i": i, "ok": True, "out": out}


def test_it_parses_a_clean_channel():
    ch = parse_channel(_lines(READY, _case(0), _case(1), DONE), 2)
    assert (ch.started, ch.done, ch.anomaly, sorted(ch.cases)) == (True, True, None, [0, 1])


@pytest.mark.parametrize(
    "raw,anomaly",
    [
        (_lines(READY, "[]"), "not a JSON object (list)"),
        (_lines(READY, "null"), "not a JSON object (NoneType)"),
        (_lines(READY, "{bad"), "not JSON"),
        (_lines(READY, "[" * 5000 + "]" * 5000), "nested deeper than 64 levels"),
        (
            _lines(READY, _case(0, "[" * 70 + "]" * 70)),
            None,
        ),  # brackets inside a string are not nesting
        (_lines(_case(0), DONE), "no start marker"),
        (_lines(READY, _case(1)), "out of order"),
        (_lines(READY, _case(0), _case(0)), "duplicated"),
        (_lines(READY, _case(0), DONE, _case(1)), "after the done marker"),
        (_lines(READY, {"t": "note", "msg": "forged"}), "unexpected line of kind 'note'"),
        (_lines(READY, {"t": "case", "i": True, "ok": True, "out": 1}), "malformed case line"),
        (_lines(READY, {"t": "case", "i": 0, "ok": True}), "malformed case line"),
        (_lines(READY, {"t": "ready"}), "unexpected line of kind 'ready'"),
        (_lines(READY, _case(0))[:-1], "truncated (no final newline)"),
        (_lines(READY) + b"\xff\xfe\n", "not UTF-8"),
        (_lines(READY) + b"x" * (5 << 20) + b"\n", "over 4 MB"),
    ],
    ids=lambda v: v if isinstance(v, str) or v is None else None,
)
def test_it_voids_a_channel_the_harness_would_not_have_written(raw, anomaly):
    ch = parse_channel(raw, 2)
    if anomaly is None:
        assert ch.anomaly is None
    else:
        assert ch.anomaly is not None and anomaly in ch.anomaly


def test_it_builds_a_seccomp_program_per_architecture():
    prog = seccomp_program("x86_64")
    assert (
        prog is not None and len(prog) % 8 == 0 and len(prog) // 8 < 255
    )  # jump offsets are one byte
    assert seccomp_program("aarch64") is not None and seccomp_program("riscv64") is None
