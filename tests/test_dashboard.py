"""The Ray dashboard as a newcomer opens it: `rllib train file --dashboard` prints the
URL and how to get the token the page asks for; headless Chromium then logs in the way
a user does (runs the command the console names, types its token into the page's
dialog, presses Submit) and finds the run's env runner actors on the Actors page while
the run goes on.

Needs Chromium (.ci/run installs Debian's `chromium`) and the dashboard's packages (the
dashboard extra). The main suite's venv lacks them on purpose: with them installed
every Ray start launches the full dashboard processes (about 3 s more a start on 2
cores), so the README's second venv (vLLM's) installs the extra and its test command
runs this test. Without either the test is skipped, except with
RAGEN_REQUIRE_DASHBOARD=1 (that command sets it), where it fails so that a lost
install step does not pass as a skip."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import pytest
from conftest import private_env, tiny_dict, wait_for

from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.cli.train import check_dashboard_installed

pytestmark = [pytest.mark.slow, pytest.mark.dashboard]

#: Chromium's names on Debian/Ubuntu and Google's build of it.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Env runner actors of the run, each to be listed on the Actors page. One: Ray starts
#: at most as many worker processes at a time as the machine has cores, so a second
#: runner adds its whole start-up to the test on a 2-core machine.
RUNNERS = 1
#: The page's login dialog (Ray 2.60's dashboard): its token field and its button.
TOKEN_FIELD = 'input[placeholder="Enter your authentication token"]'
#: The Actors table's rows of the runner class, each as its cells' texts.
ACTOR_ROWS = (
    "[...document.querySelectorAll('tbody tr')]"
    ".map(r => [...r.cells].map(c => c.innerText.trim()))"
    ".filter(cells => cells.includes('LLMEnvRunner'))"
)


def missing(why: str) -> NoReturn:
    """Skip for ``why``, or fail where the test is required (RAGEN_REQUIRE_DASHBOARD=1:
    the README's command that runs it installs what is missing)."""
    if os.environ.get("RAGEN_REQUIRE_DASHBOARD") == "1":
        pytest.fail(f"RAGEN_REQUIRE_DASHBOARD=1: {why}")
    pytest.skip(why)


def need_dashboard_packages() -> None:
    """What `rllib train file --dashboard` checks before it starts Ray; :func:`missing`
    with its message where that check fails."""
    try:
        check_dashboard_installed()
    except UsageError as err:
        missing(str(err))


class PageError(RuntimeError):
    """Chromium refused a command, or a script raised in the page."""


class Chromium:
    """Headless Chromium driven through the DevTools protocol over a pipe
    (``--remote-debugging-pipe``: commands in on its fd 3, replies out on its fd 4, each
    message JSON text ended by a NUL byte), with one page open."""

    def __init__(self, exe: str, profile: Path, log: Path):
        theirs_in, self._out = os.pipe()
        self._in, theirs_out = os.pipe()
        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank",
        ]  # fmt: skip
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                # bash, not sh: dash takes no fd numbers above 9 in a redirection.
                ["bash", "-c", f'exec "$0" "$@" 3<&{theirs_in} 4>&{theirs_out}', *args],
                pass_fds=(theirs_in, theirs_out), stdin=subprocess.DEVNULL,
                stdout=err, stderr=err,
            )  # fmt: skip
        os.close(theirs_in)
        os.close(theirs_out)
        self._id, self._buffer = 0, b""
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            reply = self.call("Target.attachToTarget", targetId=target, flatten=True)
        except BaseException:
            self.close()
            raise
        self.session = reply["sessionId"]

    def call(self, method: str, session: str | None = None, timeout: float = 120, **params):
        """Send one command and return its result, skipping the events in between."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        end = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buffer:
                left = end - time.monotonic()
                if left <= 0 or not select.select([self._in], [], [], left)[0]:
                    raise TimeoutError(f"Chromium did not answer {method} in {timeout} s")
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium exited (code {self.proc.poll()}) on {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise PageError(f"{method}: {reply['error']}")
                return reply["result"]

    def page(self, method: str, **params):
        return self.call(method, session=self.session, **params)

    def js(self, expression: str):
        """The value of ``expression`` in the page (JSON-able values only)."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise PageError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def peek(self, expression: str):
        """:meth:`js` while the page may be loading: None where it has no document yet
        (Chromium answers "navigated", or a script meets a page half built)."""
        try:
            return self.js(expression)
        except PageError:
            return None

    def text(self) -> str:
        """The page's text, for a failure's message."""
        return str(self.peek("document.body.innerText"))[:3000]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=20)
            self.proc.wait(timeout=30)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        os.close(self._in)
        os.close(self._out)


class Run:
    """``rllib train file --dashboard`` in the background, its console collected line by
    line; it trains until :meth:`stop` (its stop condition is far away)."""

    def __init__(self, tmp: Path):
        config = tiny_dict(num_env_runners=RUNNERS)
        env = config.pop("env")
        exp = tmp / "dashboard.yaml"
        exp.write_text(
            "dashboard:\n  run: StarPO\n"
            f"  env: {env}\n"
            "  stop: {training_iteration: 100000}\n"
            "  checkpoint_config: {checkpoint_at_end: false}\n"
            "  config:\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in config.items())
        )
        self.env = private_env(tmp)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(exp), "--dashboard",
             "--storage-path", str(tmp / "results"), "--num-cpus", str(RUNNERS + 2)],
            cwd=tmp, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def line(self, pattern: str, timeout: float) -> re.Match:
        """The first console line matching ``pattern``, waiting for it; the run's end or
        the timeout fails the test with the console's tail."""
        found: list[re.Match] = []

        def seen() -> bool:
            found[:] = [m for m in map(re.compile(pattern).search, list(self.lines)) if m][:1]
            return bool(found) or self.proc.poll() is not None

        wait_for(seen, timeout=timeout, every=0.2)
        assert found, f"no line /{pattern}/ on the console; its tail:\n" + self.tail()
        return found[0]

    def tail(self) -> str:
        return "\n".join(self.lines[-40:])

    def stop(self) -> None:
        """Ctrl-C, as a user ends a run; Ray's processes go with the driver. Harder
        signals to the whole process group only if it hangs."""
        for sig, grace in ((signal.SIGINT, 120), (signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            if self.proc.poll() is not None:
                return
            if sig == signal.SIGINT:
                self.proc.send_signal(sig)
            else:
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue


def test_the_dashboard_lists_the_runner_actors_after_the_login_the_console_describes(tmp_path):
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    if browser is None:
        missing(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): apt-get install chromium")
    need_dashboard_packages()
    run = Run(tmp_path)
    chromium = None
    try:
        # The console's line: the URL, and the command that prints the token.
        line = run.line(r"^Ray dashboard: (http://\S+) .*`([^`]+)`", timeout=300)
        url, command = line.group(1), line.group(2)
        assert command == "ray get-auth-token", line.group(0)

        # The user's shell: the run's environment, the venv's scripts first on PATH.
        path = f"{Path(sys.executable).parent}{os.pathsep}{run.env.get('PATH', '')}"
        got = subprocess.run(
            shlex.split(command), env={**run.env, "PATH": path},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        token = got.stdout.strip()
        assert token, got.stderr

        # The header's count of runner actors; they are up once the first iteration is
        # reported (the page fetches its list every few seconds: opened before, it
        # shows them late).
        runners = int(run.line(r"in (\d+) runner actor", timeout=300).group(1))
        assert runners == RUNNERS, run.tail()
        run.line(r"iter 1: success", timeout=300)
        # The Actors page, as a user opens it: the dashboard asks for the token over it,
        # checks it, keeps it in a cookie and reloads the page.
        chromium = Chromium(browser, tmp_path / "profile", tmp_path / "chromium.log")
        actors = url.rstrip("/") + "/#/actors"
        chromium.page("Page.navigate", url=actors)
        assert wait_for(lambda: chromium.peek(f"!!document.querySelector('{TOKEN_FIELD}')"),
                        timeout=120, every=0.5), (
            "the dashboard showed no token dialog; the page says:\n" + chromium.text()
        )  # fmt: skip
        chromium.js(f"document.querySelector('{TOKEN_FIELD}').focus()")
        chromium.page("Input.insertText", text=token)  # typed, as a user would
        chromium.js(
            "[...document.querySelectorAll('button')]"
            ".find(b => b.textContent.trim() === 'Submit').click()"
        )

        def logged_in() -> bool:
            cookies = chromium.page("Network.getCookies", urls=[url])["cookies"]
            return any(c["name"] == "ray-authentication-token" for c in cookies)

        assert wait_for(logged_in, timeout=120, every=0.5), (
            "the token was not accepted; the page says:\n" + chromium.text()
        )
        rows: list[list[str]] = []

        def listed() -> bool:  # each runner has a row, and is up (not PENDING_CREATION)
            rows[:] = chromium.peek(ACTOR_ROWS) or rows
            return sum("ALIVE" in cells for cells in rows) >= runners

        assert wait_for(listed, timeout=180, every=1.0), (
            f"not {runners} live LLMEnvRunner row(s) on the Actors page; the page says:\n"
            + chromium.text()
        )
        assert len(rows) == runners, rows
        assert run.proc.poll() is None, "the run ended before the page was read:\n" + run.tail()
    finally:
        if chromium is not None:
            chromium.close()
        run.stop()


def test_a_partly_installed_dashboard_extra_is_named_before_ray_starts(monkeypatch):
    """With the extra installed but one of Ray's dashboard modules gone (aiohttp_cors,
    which a check of a few module names misses), --dashboard's check is a usage error
    naming it, not Ray's log after the start."""
    need_dashboard_packages()
    monkeypatch.delitem(sys.modules, "ray.dashboard.optional_deps", raising=False)
    monkeypatch.setitem(sys.modules, "aiohttp_cors", None)  # its import fails: ImportError
    with pytest.raises(UsageError, match=r"missing: aiohttp_cors\).*ragen-rllib\[dashboard\]"):
        check_dashboard_installed()
