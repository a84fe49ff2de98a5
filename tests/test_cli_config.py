"""``--config PATH`` is accepted before or after the subcommand, for every subcommand (the README's
usage line: ``gateway run|chat|db upgrade|doctor [--config PATH]``)."""

from __future__ import annotations

import pytest

from gateway.app.cli import main

COMMANDS = [
    ["run"], ["chat"], ["db", "upgrade"], ["doctor"], ["pairing", "approve", "K7PQ2M"],
    ["jobs", "list"], ["jobs", "remove", "j1"], ["jobs", "run", "j1"],
    ["jobs", "add", "--schedule", "@daily", "--tz", "UTC", "--to", "telegram:1:2", "the", "report"],
    ["skills", "list"], ["skills", "show", "x"], ["skills", "validate"], ["skills", "validate", "a", "b"],
    ["skills", "eval", "x", "--runs", "2"], ["sessions", "export", "abc", "--as-eval"],
]


@pytest.fixture
def broken_config(tmp_path):
    """A config file with an unknown key: loading it fails with a message naming the key, so
    the message proves the file given with ``--config`` was the one read."""
    path = tmp_path / "broken.toml"
    path.write_text("[http]\nbogus_key_for_cli_test = 1\n")
    return str(path)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
@pytest.mark.parametrize("where", ["before", "after"])
def test_config_is_read_before_or_after_the_subcommand(command, where, broken_config, capsys, monkeypatch):
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    argv = ["--config", broken_config, *command] if where == "before" else [*command, "--config", broken_config]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" not in err
    assert err.startswith("error: invalid configuration:") and "bogus_key_for_cli_test" in err


def test_db_upgrade_uses_the_database_of_the_config_given_after_it(tmp_path, capsys, keep_logging):
    path = tmp_path / "gateway.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "from-file.db"}"\n')
    assert main(["db", "upgrade", "--config", str(path)]) == 0
    assert "from-file.db" in capsys.readouterr().out
    assert (tmp_path / "from-file.db").is_file()


def test_the_config_after_the_subcommand_wins_over_the_one_before(tmp_path, capsys, keep_logging):
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "first.db"}"\n')
    second.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "second.db"}"\n')
    assert main(["--config", str(first), "db", "upgrade", "--config", str(second)]) == 0
    assert "second.db" in capsys.readouterr().out and not (tmp_path / "first.db").exists()


def test_startup_objects_are_frozen_and_the_collector_runs_less_often() -> None:
    """What exists once the gateway started (modules, config, compiled statements) is moved out
    of the collector's generations, so a full collection in a burst does not walk it again; the
    youngest generation is collected after 20,000 allocations, not CPython's 700."""
    import gc

    from gateway.app.cli import GC_THRESHOLDS, tune_collector

    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_freeze_count() > before
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] > thresholds[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit() -> None:
    """Started with the common 1024 (here 512) descriptors, the gateway takes what the hard limit
    allows: 512 turns in flight hold more connections than that."""
    import resource

    from gateway.app.cli import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 512, "this machine's hard limit of open files is too low to try it"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
        assert raise_open_files_limit() == (512, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        assert raise_open_files_limit() is None  # already there
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("name, value", [
    ("GATEWAY__MCP__SERVERS", '{"git": {"command": ["uvx"], "env": {"TOKEN": "sk-env-secret-4411"}}'),
    ("GATEWAY__CHATS", "[{"), ("GATEWAY__HTTP__TRUSTED_PROXIES", "10.0.0.0/8")])
def test_an_environment_value_that_is_not_json_is_one_line_naming_the_variable(name, value, capsys, monkeypatch):
    """A table or a list given in the environment is JSON; a broken one raised pydantic-settings'
    ``SettingsError`` out of ``main``: a traceback naming only the section ("mcp"), not the
    variable. Now one line names the variable and what JSON found wrong, never the value."""
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    monkeypatch.setenv(name, value)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: environment variable {name} is not valid JSON") and err.count("\n") == 1, err
    assert "Traceback" not in err and "sk-env-secret-4411" not in err


@pytest.mark.parametrize(("body", "problem"), [
    ("command = []", "give command (a stdio server's argv, not empty) or url"),
    ("timeout_s = 5", "give command (a stdio server's argv, not empty) or url"),
    ('command = ["uvx", "mcp-server-git"]\nurl = "https://mcp.example/mcp"', "not both"),
    ('url = "mcp.example/mcp"', "url must start with http:// or https://"),
    ('command = ["uvx", ""]', "command has an empty part"),
])
def test_an_mcp_server_without_one_usable_transport_is_refused_naming_the_server(tmp_path, capsys, body, problem):
    """An empty command, or neither command nor url, started the gateway and failed later with
    httpx's "Request URL is missing an 'http://'" naming no key; both used the command silently."""
    path = tmp_path / "gateway.toml"
    path.write_text(f"[mcp.servers.git]\n{body}\n")
    assert main(["db", "upgrade", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid configuration: mcp.servers.git: ") and problem in err


def test_a_switched_off_mcp_server_may_be_a_placeholder(tmp_path, capsys, keep_logging):
    path = tmp_path / "gateway.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "gw.db"}"\n[mcp.servers.later]\nenabled = false\n')
    assert main(["db", "upgrade", "--config", str(path)]) == 0
