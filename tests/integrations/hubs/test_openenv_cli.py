"""``twice serve`` as a command: its settings are checked before anything is bound, and the server it
starts passes ``openenv validate``. (Without openenv installed, the command names the extra.)"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twice_envs import cli

HAS_OPENENV = importlib.util.find_spec("openenv") is not None
needs_openenv = pytest.mark.skipif(not HAS_OPENENV, reason="needs openenv (tests/sidecar/hubs.sh)")


@pytest.mark.skipif(HAS_OPENENV, reason="openenv is installed here")
def test_without_openenv_the_command_names_the_extra(capsys):
    assert cli.main(["serve", "SearchToy-v0"]) == 1
    assert "pip install 'twice-envs[openenv]'" in capsys.readouterr().err


@needs_openenv
@pytest.mark.parametrize("argv, problem", [
    (["NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
    (["SearchToy-v0", "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
    (["SearchToy-v0", "--env-kwargs", "{bad"], "--env-kwargs is not JSON"),
    (["SearchToy-v0", "--env-kwargs", '{"sped": 1}'], "unknown kwargs 'sped'"),
    (["SearchToy-v0", "--max-sessions", "0"], "max_sessions must be an int >= 1"),
    (["SearchToy-v0", "--session-timeout", "nan"], "session_timeout must be a positive number"),
    (["SearchToy-v0", "--port", "70000"], "port must be in 0..65535"),
    (["SearchToy-v0", "--host", "0.0.0.0"], "host '0.0.0.0' is reachable from other machines"),
])
def test_bad_settings_are_named_before_anything_is_bound(argv, problem, capsys, monkeypatch):
    monkeypatch.delenv("TWICE_SERVE_TOKEN", raising=False)
    assert cli.main(["serve", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("twice serve: error: ") and problem in err, err


@needs_openenv
def test_the_served_env_passes_openenv_validate(tmp_path):
    validate = Path(sys.executable).with_name("openenv")
    assert validate.exists() or shutil.which("openenv"), "openenv's command line is not installed"
    env = {**os.environ, "TWICE_SERVE_TOKEN": ""}
    server = subprocess.Popen([sys.executable, "-m", "twice_envs.cli", "serve", "SearchToy-v0", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = server.stdout.readline()
        assert line.startswith("twice serve: SearchToy-v0 at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        report = subprocess.run([str(validate), "validate", "--url", url, "--json"], capture_output=True,
                                text=True, timeout=120)
    finally:
        server.terminate()
        server.wait(20)
    assert report.returncode == 0, report.stdout + report.stderr
    result = json.loads(report.stdout)
    assert result["passed"] is True and result["mode"] == "simulation"
    assert not result["summary"]["failed_criteria"]
