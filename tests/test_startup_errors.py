"""Start-up failures are one line on stderr naming the setting and the cause, exit status 2, no
secret and no traceback: ``gateway run`` as a subprocess against the loopback fakes, which refuse
a wrong credential as the real APIs do (Telegram 401/404, Slack ``invalid_auth``, Feishu 10014),
and against a database nobody listens for. Also: uncaught exceptions, thread exceptions,
warnings, asyncio's exception handler and finalizers at interpreter shutdown all go through the
redaction, and the redaction filter never raises while the interpreter shuts down."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import FEISHU_APP, TEST_TOKEN

ROOT = Path(__file__).resolve().parent.parent
WRONG_TG = "7000000001:AAWrongTokenWrongTokenWrongToken9999"
MALFORMED_TG = "not-a-telegram-token-secret"
WRONG_SLACK = "xoxb-wrong-secret-token-0001"
WRONG_APP = "xapp-1-wrong-secret-app-token"
WRONG_FEISHU = "wrong-feishu-app-secret-0001"
PG_PASSWORD = "pg-secret-pass-123"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def toml(tmp: Path, name: str, body: str, db_url: str | None = None) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""
        [database]
        url = "{db_url or f'sqlite:///{tmp / name}.db'}"
        [http]
        port = 0
        [llm]
        api_key_env = "GATEWAY_TEST_OPENAI_KEY"
        [tools]
        browser_enabled = false
        """) + textwrap.dedent(body))
    return path


def run_gateway(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY__", "PYTEST"))}
    full.update(env, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gateway", "run", "--config", str(config)], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fake_telegram, fake_slack, fake_feishu):
    """Every case's ``gateway run`` (in parallel: each is a fresh interpreter): name -> (result, secret)."""
    tmp = tmp_path_factory.mktemp("startup")
    telegram = f"""
        [telegram]
        enabled = true
        token_env = "GW_T_TOKEN"
        base_url = "{fake_telegram.url}"
        poll_timeout_s = 1
        """
    slack = f"""
        [slack]
        enabled = true
        bot_token_env = "GW_S_BOT"
        signing_secret_env = "GATEWAY_TEST_SLACK_SIGNING_SECRET"
        app_token_env = "GW_S_APP"
        api_url = "{fake_slack.url}/api/"
        """
    feishu = f"""
        [feishu]
        enabled = true
        app_id_env = "GATEWAY_TEST_FEISHU_APP_ID"
        app_secret_env = "GW_F_SECRET"
        verification_token_env = "GATEWAY_TEST_FEISHU_TOKEN"
        domain = "{fake_feishu.url}"
        """
    pg = f"postgresql+psycopg://gw:{PG_PASSWORD}@127.0.0.1:{closed_port()}/gw"
    cases = {
        "telegram": (toml(tmp, "telegram", telegram), {"GW_T_TOKEN": WRONG_TG}, WRONG_TG),
        "telegram_malformed": (toml(tmp, "telegram_malformed", telegram), {"GW_T_TOKEN": MALFORMED_TG},
                               MALFORMED_TG),
        "slack": (toml(tmp, "slack", slack), {"GW_S_BOT": WRONG_SLACK, "GW_S_APP": fake_slack.app_token},
                  WRONG_SLACK),
        "slack_socket": (toml(tmp, "slack_socket", slack + 'mode = "socket"\n'),
                         {"GW_S_BOT": fake_slack.bot_token, "GW_S_APP": WRONG_APP}, WRONG_APP),
        "feishu": (toml(tmp, "feishu", feishu), {"GW_F_SECRET": WRONG_FEISHU}, WRONG_FEISHU),
        "database": (toml(tmp, "database", telegram, db_url=pg), {"GW_T_TOKEN": TEST_TOKEN}, PG_PASSWORD),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {name: pool.submit(run_gateway, path, env) for name, (path, env, _) in cases.items()}
        return {name: (future.result(), cases[name][2]) for name, future in futures.items()}


EXPECTED = {
    "telegram": "error: GW_T_TOKEN was rejected by Telegram (401 Unauthorized)",
    "telegram_malformed": "error: GW_T_TOKEN was rejected by Telegram (404 Not Found)",
    "slack": "error: GW_S_BOT was rejected by Slack (invalid_auth)",
    "slack_socket": "error: GW_S_APP was rejected by Slack (invalid_auth)",
    "feishu": "error: GW_F_SECRET was rejected by Feishu (tenant_access_token: code 10014, app secret invalid)",
}


@pytest.mark.parametrize("case", [*EXPECTED, "database"])
def test_a_start_up_failure_is_one_line_exit_2_no_secret_no_traceback(runs, case):
    result, secret = runs[case]
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr[-2000:]
    if case == "database":
        assert errors[0].startswith("error: database.url (postgresql+psycopg://gw:***@127.0.0.1:"), errors[0]
        assert "is unreachable:" in errors[0] and "refused" in errors[0].lower()
    else:
        assert errors[0] == EXPECTED[case]
    output = result.stdout + result.stderr
    assert secret not in output
    for noise in ("Traceback", "Exception ignored", "meta_path", " ERROR ", " CRITICAL "):
        assert noise not in output, result.stderr[-2000:]
    assert all(line.split()[2:3] == ["INFO"] for line in lines[:-1]), result.stderr[-2000:]  # only INFO logs before


def test_the_fakes_reject_a_wrong_credential_like_the_platforms(fake_telegram, fake_slack, fake_feishu):
    import json
    import urllib.error
    import urllib.request

    def post(url: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert post(f"{fake_telegram.url}/bot{WRONG_TG}/getMe") == (
        401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
    assert post(f"{fake_telegram.url}/bot{MALFORMED_TG}/getMe") == (
        404, {"ok": False, "error_code": 404, "description": "Not Found"})
    assert post(f"{fake_slack.url}/api/auth.test", headers={"Authorization": f"Bearer {WRONG_SLACK}"}) == (
        200, {"ok": False, "error": "invalid_auth"})
    token_url = f"{fake_feishu.url}/open-apis/auth/v3/tenant_access_token/internal"
    wrong = json.dumps({"app_id": FEISHU_APP["app_id"], "app_secret": WRONG_FEISHU}).encode()
    unknown = json.dumps({"app_id": "cli_unknown000000001", "app_secret": WRONG_FEISHU}).encode()
    json_header = {"Content-Type": "application/json"}
    for body, code, msg in ((wrong, 10014, "app secret invalid"), (unknown, 10003, "invalid param")):
        answer = post(token_url, body, json_header)[1]
        assert (answer["code"], answer["msg"]) == (code, msg) and "tenant_access_token" not in answer


HOOKS_SCRIPT = """
import asyncio, logging, sys, threading, warnings
from gateway.ops.logs import install_hooks, loop_exception_handler, setup_logging

SECRET = "hook-secret-value-0001"
setup_logging("INFO", [SECRET])
install_hooks()
warnings.warn(f"warning quoting {SECRET}")
thread = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError(f"thread {SECRET}")), name="t1")
thread.start(); thread.join()

async def main():
    asyncio.get_running_loop().set_exception_handler(loop_exception_handler)
    future = asyncio.get_running_loop().create_future()
    future.set_exception(RuntimeError(f"future {SECRET}"))
    del future  # "exception was never retrieved" goes to the loop's exception handler
    await asyncio.sleep(0)
asyncio.run(main())

class Late:
    # Logged while the interpreter shuts down (sys.meta_path is None by then); the bearer shape
    # is replaced by a function, not a regex template (a template would import re at that point).
    def __del__(self):
        logging.getLogger("late").warning("closing: Authorization: Bearer abcdefghijklmnopqrstuv " + SECRET)

class Finalized:
    def __del__(self):
        raise RuntimeError(f"finalizer {SECRET}")

late = Late()
Finalized()
raise RuntimeError(f"uncaught {SECRET}")
"""


def test_every_path_to_stderr_is_redacted_and_shutdown_logging_does_not_raise():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", HOOKS_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    err = result.stderr
    assert result.returncode == 1
    assert "hook-secret-value-0001" not in err + result.stdout
    for marker in ("warning quoting ***", "RuntimeError: thread ***", "RuntimeError: future ***",
                   "RuntimeError: finalizer ***", "RuntimeError: uncaught ***",
                   "closing: Authorization: Bearer *** ***"):
        assert marker in err, (marker, err[-3000:])
    assert "meta_path" not in err and "Logging error" not in err and "could not be checked" not in err


def test_the_filter_never_raises_and_never_lets_an_unchecked_record_through():
    import logging

    from gateway.ops.logs import UNCHECKED, RedactSecrets

    class Broken:
        def __str__(self) -> str:
            raise ImportError("sys.meta_path is None, Python is likely shutting down")

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "token %s", (Broken(),), None)
    assert RedactSecrets(["hook-secret-value-0001"]).filter(record) is True
    assert record.getMessage() == UNCHECKED and record.exc_info is None


@pytest.mark.parametrize(("body", "expected"), [
    (b'[database\nurl = "x"\n', "is not valid TOML: Expected ']' at the end of a table declaration (at line 1"),
    (b'[llm]\nmodel = "\xff"\n', "is not UTF-8 (byte 15)"),
])
def test_a_broken_config_file_is_one_line_and_exit_2(tmp_path, body, expected):
    path = tmp_path / "gateway.toml"
    path.write_bytes(body)
    result = run_gateway(path, {})
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: config file {path} {expected}"), result.stderr


@pytest.mark.parametrize(("env", "expected"), [
    ({"GATEWAY__HTTP__PORT": "70000"}, "http.port: Input should be less than or equal to 65535"),
    ({"GATEWAY__BUS__SWEEP_INTERVAL_S": "0"}, "bus.sweep_interval_s: Input should be greater than 0"),
    ({"GATEWAY__AGENT__ITERATION_BUDGET": "-5"}, "agent.iteration_budget: Input should be greater than or equal to 1"),
    ({"GATEWAY__LOGGING__LEVEL": "LOUD"}, "logging.level: 'LOUD' is not a log level; one of DEBUG, INFO"),
    ({"GATEWAY__FEISHU__APP_SECRET_ENV": "cli_a1b2PastedSecret9x"},
     "feishu.app_secret_env: not an environment variable name"),
    ({"GATEWAY__LLM__API_KEY_ENV": "sk-short-pasted-key"}, "llm.api_key_env: not an environment variable name"),
])
def test_an_out_of_range_setting_or_a_secret_where_its_name_goes_is_one_line_and_exit_2(tmp_path, env, expected):
    """Values that would start a broken gateway (a port taken modulo 65536, a sweeper spinning on
    a zero interval, every turn refused by a negative budget) and a secret pasted into a ``*_env``
    key are refused before anything starts; the pasted value is never repeated."""
    path = tmp_path / "gateway.toml"
    path.write_text("")
    result = run_gateway(path, env)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid configuration: ") and expected in lines[0], lines
    for value in env.values():
        if "ecret" in value or value.startswith("sk-"):
            assert value not in result.stderr + result.stdout
