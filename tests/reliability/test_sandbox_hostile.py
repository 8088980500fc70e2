"""Hostile programs (tests/reliability/sandbox_hostile_programs.py) against
training.sandbox.run_tests, as this process's user (root in CI) and as an unprivileged worker (a
driver dropped to a spare uid).

Each run must end as a scored failure: passed 0, fraction exactly 0.0 (never NaN), a reason (an
error or a failure line), within its timeout plus a margin. Around it we check the host: our process
and a host "sleeper" are alive, no marker file appeared, nobody connected to the TCP, Unix-path or
abstract-socket listeners, no sandbox process survived (found by the run id on its command line),
the per-run cgroup is gone, no forged note got into the result.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.sandbox_hostile_programs import PROGRAMS, Program, render
from training.sandbox import run_tests

PROJECT = Path(__file__).resolve().parents[2]
PROGRAMS_FILE = Path(__file__).with_name("sandbox_hostile_programs.py")
TAG = secrets.token_hex(4)
SECRET = "S3CR3T-" + secrets.token_hex(
    6
)  # a hidden expected value (and the keyring payload): never sent
MARGIN_S = 4.0  # bwrap + interpreter start-up and the teardown on a loaded 2-core machine
RESULTS: list[tuple[str, str, float]] = []
KEYCTL, ADD_KEY = 250, 248  # x86_64; the keyring control check is skipped elsewhere


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class Host:
    """What the programs attack on the host, and how to tell whether they reached it."""

    def __init__(self, tmp: Path) -> None:
        self.tcp = self._listener(socket.AF_INET, ("127.0.0.1", 0))
        tmp.chmod(0o755)
        self.unix_path = str(tmp / "host.sock")
        self.unix = self._listener(socket.AF_UNIX, self.unix_path)
        os.chmod(
            self.unix_path, 0o777
        )  # so that only the sandbox, not permissions, keeps a worker out
        self.abstract = f"rd-sbx-abstract-{TAG}"
        self.abstract_sock = self._listener(socket.AF_UNIX, "\0" + self.abstract)
        self.cmdline_secret = f"rd-cmdline-secret-{TAG}"
        self.sleeper = subprocess.Popen(
            ["/bin/sh", "-c", "sleep 600", self.cmdline_secret], start_new_session=True
        )
        self.key_desc = f"rd-sbx-key-{TAG}"
        self.key_id = self._add_key()
        self.markers = [
            f"/tmp/sandbox_pwned_{TAG}",
            str(PROJECT / f"sandbox_pwned_{TAG}"),
            f"/etc/pwned_{TAG}",
            f"/root/pwned_{TAG}",
        ]

    @staticmethod
    def _listener(family: int, address: object) -> socket.socket:
        s = socket.socket(family)
        s.bind(address)
        s.listen(5)
        s.setblocking(False)
        return s

    def _add_key(self) -> int | None:
        if os.uname().machine != "x86_64":
            return None
        payload = SECRET.encode()
        kid = _libc().syscall(ADD_KEY, b"user", self.key_desc.encode(), payload, len(payload), -3)
        if kid <= 0:
            return None  # keyctl may be filtered in this container: nothing to steal then
        # Control: outside the sandbox the key is found through the session keyring bwrap inherits.
        assert _libc().syscall(KEYCTL, 10, -3, b"user", self.key_desc.encode(), 0) == kid
        return kid

    def ctx(self, parent_pid: int) -> dict[str, object]:
        return {
            "PORT": self.tcp.getsockname()[1],
            "UNIX_PATH": self.unix_path,
            "ABSTRACT": self.abstract,
            "KEY_DESC": self.key_desc,
            "CMDLINE_SECRET": self.cmdline_secret,
            "PARENT_PID": parent_pid,
            "SLEEPER_PID": self.sleeper.pid,
            "MARKER": self.markers[0],
            "PROJECT_MARKER": self.markers[1],
            "TAG": TAG,
            "PROJECT": str(PROJECT),
        }

    def breaches(self) -> list[str]:
        found = [f"wrote {p}" for p in self.markers if os.path.exists(p)]
        for name, sock in (
            ("TCP", self.tcp),
            ("Unix path", self.unix),
            ("abstract Unix", self.abstract_sock),
        ):
            try:
                sock.accept()[0].close()
                found.append(f"connected to the host's {name} listener")
            except BlockingIOError:
                pass
        if self.sleeper.poll() is not None:
            found.append("killed a host process")
        return found

    def close(self) -> None:
        for s in (self.tcp, self.unix, self.abstract_sock):
            s.close()
        self.sleeper.kill()
        self.sleeper.wait()
        if self.key_id is not None:
            _libc().syscall(KEYCTL, 9, self.key_id, -3)  # KEYCTL_UNLINK from the session keyring


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Iterator[Host]:
    h = Host(tmp_path_factory.mktemp("hostile"))
    try:
        yield h
    finally:
        h.close()


def expected_for(program: Program) -> str:
    return SECRET if program.expect == "SECRET" else "pwned"


def record(program: Program, result, took: float) -> dict:
    return {
        "name": program.name,
        "passed": result.passed,
        "total": result.total,
        "fraction": result.fraction,
        "error": result.error,
        "failures": result.failures,
        "notes": result.notes,
        "took": took,
        "run_id": result.run_id,
    }


def scored_failure_problems(program: Program, rec: dict) -> list[str]:
    """What is wrong with one run's verdict, as seen by a trainer."""
    problems = []
    if rec["passed"] != 0:
        problems.append(f"scored {rec['passed']}/{rec['total']}: the attack passed")
    if (
        not isinstance(rec["fraction"], float)
        or math.isnan(rec["fraction"])
        or rec["fraction"] != 0.0
    ):
        problems.append(f"score {rec['fraction']!r} is not 0.0")
    if not (rec["error"] or rec["failures"]):
        problems.append("no reason given")
    if rec["took"] > program.timeout_s + MARGIN_S:
        problems.append(f"took {rec['took']:.1f} s")
    if any("FORGED" in n for n in rec["notes"]):
        problems.append("a forged note reached the result")
    if not any("every sandbox process was gone" in n for n in rec["notes"]):
        problems.append("the parent did not confirm the sandbox was torn down")
    return problems


def survivors(run_ids: list[str]) -> list[int]:
    """Host processes whose command line carries one of these run ids (the sandbox's argv)."""
    wanted = [f"rd-sandbox-{r}".encode() for r in run_ids if r]
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if any(w in cmdline for w in wanted):
                found.append(int(entry))
    return found


def leftover_cgroups(run_id: str) -> list[str]:
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/**/rd-sandbox-{run_id}")]


# These wait for a wall or CPU limit (3-4 s each under load); the rest take 0.1-0.5 s.
WAITING = {
    "sleep past the timeout in a finally block",
    "recursion bomb (limit raised to 10**6)",
    "spin the CPU forever",
}


@pytest.mark.parametrize(
    "program",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in WAITING else p for p in PROGRAMS],
    ids=[p.name for p in PROGRAMS],
)
def test_it_contains_the_hostile_program(program: Program, host: Host, monkeypatch):
    monkeypatch.setenv("SANDBOX_HOSTILE_SECRET", "leak-me")
    code = render(program.code, host.ctx(os.getpid()))
    t0 = time.monotonic()
    result = run_tests(code, "f", [((), expected_for(program))], timeout_s=program.timeout_s)
    rec = record(program, result, time.monotonic() - t0)
    RESULTS.append((program.name, _outcome(rec), rec["took"]))
    problems = scored_failure_problems(program, rec) + host.breaches()
    problems += [f"process {p} survived" for p in survivors([result.run_id])]
    problems += [f"cgroup {c} left behind" for c in leftover_cgroups(result.run_id)]
    assert not problems, (program.name, problems, result)


# The unprivileged worker: a spare uid far above real accounts, so "no process of that uid is left"
# cannot be confused with anybody else's processes.
SPARE_UID = 1_900_000_000 + secrets.randbelow(1_000_000)
DRIVER = r"""
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("programs", sys.argv[1])
# dataclasses looks the module up
programs = sys.modules["programs"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(programs)
sys.path.insert(0, sys.argv[2])
from training.sandbox import run_tests
ctx, secret = json.loads(sys.argv[3]), sys.argv[4]
ctx["PARENT_PID"] = os.getpid()
for p in programs.PROGRAMS:
    t0 = time.monotonic()
    expected = secret if p.expect == "SECRET" else "pwned"
    r = run_tests(programs.render(p.code, ctx), "f", [((), expected)], timeout_s=p.timeout_s)
    print(json.dumps({"name": p.name, "passed": r.passed, "total": r.total, "fraction": r.fraction,
                      "error": r.error, "failures": r.failures, "notes": r.notes,
                      "took": time.monotonic() - t0, "run_id": r.run_id, "uid": os.getuid()}),
          flush=True)
"""


def _unprivileged_python() -> str | None:
    """An interpreter the spare uid can run (the venv's lives under /root, mode 0700, here)."""
    probe = "import os, sys; assert os.access(os.path.realpath(sys.executable), os.X_OK)"
    for candidate in ("/usr/bin/python3", sys.executable):
        ok = subprocess.run(
            [
                "setpriv",
                f"--reuid={SPARE_UID}",
                f"--regid={SPARE_UID}",
                "--clear-groups",
                candidate,
                "-I",
                "-c",
                probe,
            ],
            capture_output=True,
            env={},
        )
        if ok.returncode == 0:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="dropping to an unprivileged uid needs root and setpriv (util-linux)",
)
def test_it_contains_every_hostile_program_as_an_unprivileged_worker(host: Host):
    python = _unprivileged_python()
    if python is None:
        pytest.fail(
            f"no interpreter runnable by uid {SPARE_UID}: install python3 (Debian) for this test"
        )
    cmd = [
        "setpriv",
        f"--reuid={SPARE_UID}",
        f"--regid={SPARE_UID}",
        "--clear-groups",
        python,
        "-I",
        "-c",
        DRIVER,
        str(PROGRAMS_FILE),
        str(PROJECT),
        json.dumps(host.ctx(0)),
        SECRET,
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    records = {r["name"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert out.returncode == 0 and len(records) == len(PROGRAMS), out.stderr[-3000:]
    problems = {}
    for program in PROGRAMS:
        rec = records[program.name]
        RESULTS.append((f"[uid {SPARE_UID}] {program.name}", _outcome(rec), rec["took"]))
        found = scored_failure_problems(program, rec) + (["ran as root"] if rec["uid"] == 0 else [])
        if found:
            problems[program.name] = found
    breaches = host.breaches() + [
        f"process {p} survived" for p in survivors([r["run_id"] for r in records.values()])
    ]
    breaches += [f"process {p} of uid {SPARE_UID} survived" for p in _pids_of_uid(SPARE_UID)]
    assert not problems and not breaches, (problems, breaches, sorted(records))


def _pids_of_uid(uid: int) -> list[int]:
    """Live processes of `uid`. Zombies are dead: the sandbox init is reparented to the host's init,
    which may reap it a moment later."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry))
        except (OSError, IndexError):
            pass
    return found


def _outcome(rec: dict) -> str:
    why = rec["error"] or (rec["failures"][0] if rec["failures"] else "")
    return f"passed {rec['passed']}/{rec['total']}; {why[:70]}"


def test_it_covers_every_attack_class_with_at_least_40_programs():
    assert {p.name for p in PROGRAMS} >= WAITING
    areas = {p.area for p in PROGRAMS}
    assert len(PROGRAMS) >= 40 and areas == {"escape", "resources", "channel", "forgery"}
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)  # names identify programs in messages


def test_it_prints_the_outcome_table(capsys):
    if not RESULTS:
        pytest.skip("no hostile program ran in this session")
    with capsys.disabled():
        print(f"\n{'hostile program':<72} {'s':>5}  outcome")
        for name, outcome, took in RESULTS:
            print(f"{name[:72]:<72} {took:>5.2f}  {outcome}")
        print(
            f"{len(RESULTS)} runs, {sum(t for *_, t in RESULTS):.1f} s, load "
            f"{os.getloadavg()[0]:.2f}"
        )
    assert all(outcome.startswith("passed 0/") for _, outcome, _ in RESULTS)
