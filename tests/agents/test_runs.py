"""A run folder from elsewhere is trusted no more than a record: its config.json's env id is looked
up in the registry only, and its file and folder kwargs need --trust-kwargs (twice eval, twice audit)."""

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twice_envs import cli
from twice_envs.agents.models.runs import checked_run_config
from twice_envs.agents.training.config import TrainConfig
from twice_envs.errors import DataFormatError
from twice_envs.trust import PATH_NAMES, UntrustedInput, path_kwargs

PLANTED = "planted_run_mod"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on the path that leaves a file behind if anything imports it."""
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "imported"
    (code / f"{PLANTED}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(code))
    for env_id in ("SearchQA-v0", "WebShop-v0"):  # the registered envs' own modules, imported by the check
        path_kwargs(env_id, {})
    yield marker
    sys.modules.pop(PLANTED, None)


def run_folder(root, **fields):
    """A run folder whose config.json holds TrainConfig's fields with ``fields`` over them (a JSON value
    of any kind under ``"raw"`` replaces the whole file), and a placeholder checkpoint."""
    run = root / "run"
    (run / "checkpoint").mkdir(parents=True, exist_ok=True)
    (run / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    data = fields["raw"] if "raw" in fields else {**TrainConfig().to_json(), **fields}
    (run / "config.json").write_text(json.dumps(data))
    return run


def files_under(root):
    return sorted(str(p) for p in root.rglob("*"))


#: (config fields, what the error must say): ids that name a module, are not registered or not
#: strings, kwargs that name files or folders, kwargs that are not an object, fields of the wrong kind.
HOSTILE = [
    ({"env": f"{PLANTED}:Planted-v0"}, f"env id '{PLANTED}:Planted-v0' names a module to import ('{PLANTED}'), "
                                       "and 'Planted-v0' is not registered"),
    ({"env": "os:system"}, "names a module to import ('os')"),
    ({"env": "twice_envs/" + PLANTED + ":X-v0"}, "names a module"),
    ({"env": "Nope-v0"}, "env id 'Nope-v0' is not registered"),
    ({"env": 5}, "the env id must be a string, found int"),
    ({"env": None}, "the env id must be a string, found NoneType"),
    ({"env": ["SearchQA-v0"]}, "the env id must be a string, found list"),
    ({"env_kwargs": {"journal": "{tmp}/elsewhere/j.sqlite"}}, "(journal='{tmp}/elsewhere/j.sqlite')"),
    ({"env_kwargs": {"corpus": "/etc/passwd", "topk": 3}}, "(corpus='/etc/passwd')"),
    ({"env_kwargs": {"questions": {"dev": "{tmp}/q.jsonl"}}}, "(questions={'dev': '{tmp}/q.jsonl'})"),
    ({"env_kwargs": {"Journal": "x.db", "index_dir": "/i"}}, "(Journal='x.db', index_dir='/i')"),
    ({"env": "twice_envs/SearchQA-v0", "env_kwargs": {"journal": "j"}}, "for SearchQA-v0 (journal='j')"),
    ({"env": "WebShop-v0", "env_kwargs": {"cache_root": "/c", "products_path": "p"}},
     "(cache_root='/c', products_path='p')"),
    ({"env_kwargs": ["journal", "x"]}, "the env kwargs must be a JSON object, found list"),
    ({"env_kwargs": "journal=x"}, "the env kwargs must be a JSON object, found str"),
    ({"task_ids": ["x"]}, "not a training config"),
    ({"no_such_field": 1}, "not a training config"),
    ({"raw": [1, 2]}, "expected a JSON object of training settings"),
]


@pytest.mark.parametrize("fields,says", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_a_hostile_run_config_is_refused_by_name_and_nothing_is_imported_or_created(tmp_path, planted, fields,
                                                                                    says):
    fields = json.loads(json.dumps(fields).replace("{tmp}", str(tmp_path)))
    run = run_folder(tmp_path, **fields)
    before, modules = files_under(tmp_path), set(sys.modules)
    with pytest.raises((UntrustedInput, DataFormatError)) as info:
        checked_run_config(run)
    message = str(info.value)
    assert str(run / "config.json") in message and says.replace("{tmp}", str(tmp_path)) in message
    assert "Traceback" not in message
    assert files_under(tmp_path) == before and not planted.exists()
    assert set(sys.modules) <= modules


@pytest.mark.parametrize("command", ["eval", "audit"])
def test_eval_and_audit_refuse_a_run_folder_the_way_replay_refuses_a_record(tmp_path, planted, command, capsys):
    run = run_folder(tmp_path, env_kwargs={"journal": str(tmp_path / "elsewhere" / "j.sqlite")})
    assert cli.main([command, "--checkpoint", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"twice {command}: error: {run / 'config.json'} names files or folders" in err
    assert "journal=" in err and "--trust-kwargs" in err
    assert not (tmp_path / "elsewhere").exists()
    # with consent the kwargs pass, and the (placeholder) checkpoint is what stops the command
    assert cli.main([command, "--checkpoint", str(run), "--trust-kwargs"]) == 1
    assert f"error: {run / 'checkpoint' / 'state.pt'}: " in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


def test_eval_refuses_a_module_id_in_the_run_config_and_imports_nothing(tmp_path, planted, capsys):
    run = run_folder(tmp_path, env=f"{PLANTED}:Planted-v0")
    assert cli.main(["eval", "--checkpoint", str(run)]) == 1
    err = capsys.readouterr().err
    assert "names a module" in err and "name it yourself with --env" in err
    assert not planted.exists() and PLANTED not in sys.modules
    # a registered name is looked up: its module is ignored, and the (placeholder) checkpoint stops eval
    run = run_folder(tmp_path, env=f"{PLANTED}:SearchQA-v0")
    assert cli.main(["eval", "--checkpoint", str(run)]) == 1
    assert f"error: {run / 'checkpoint' / 'state.pt'}: " in capsys.readouterr().err
    assert not planted.exists() and PLANTED not in sys.modules


def test_the_users_own_choices_need_no_consent(tmp_path):
    run = run_folder(tmp_path, env="SearchQA-v0", env_kwargs={"journal": "j.sqlite", "topk": 3})
    # audit: the user's --env-kwargs replace the run's journal; another env drops the run's kwargs
    assert checked_run_config(run, env="SearchQA-v0", exempt={"journal"}, kwargs_follow_env=False) is not None
    assert checked_run_config(run, env="WebShop-v0", kwargs_follow_env=False) is not None
    # eval: the run's kwargs go to whatever env is played, so they are checked against it
    with pytest.raises(UntrustedInput, match="journal='j.sqlite'"):
        checked_run_config(run, env="WebShop-v0")
    assert checked_run_config(tmp_path / "no-run") is None  # no config.json: the defaults


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    module=st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True),
    name=st.sampled_from(["Nope-v0", "", "searchqa-v0", "SearchQA-v0 "]),
    path_kwarg=st.sampled_from(PATH_NAMES + ("data_dir", "my_file", "cache_root", "corpus_path")),
    value=st.one_of(st.text(min_size=1, max_size=20), st.integers(), st.lists(st.text(max_size=5), max_size=3)),
)
def test_fuzzed_ids_and_path_kwargs_are_refused(tmp_path, planted, module, name, path_kwarg, value):
    modules = set(sys.modules)
    run = run_folder(tmp_path, env=f"{module}:{name}")
    with pytest.raises(UntrustedInput, match="names a module"):
        checked_run_config(run)
    run = run_folder(tmp_path, env="SearchQA-v0", env_kwargs={path_kwarg: value})
    with pytest.raises(UntrustedInput, match=rf"{path_kwarg}="):
        checked_run_config(run)
    assert set(sys.modules) <= modules and not planted.exists()


def test_eval_plays_the_registered_name_of_a_module_id_and_never_imports_the_module(tmp_path, planted, monkeypatch):
    from twice_envs.agents.cli import train as train_cli
    from twice_envs.agents.training.config import read_run_config

    run = run_folder(tmp_path, env=f"{PLANTED}:CreditToy-v0")
    assert checked_run_config(run).env == "CreditToy-v0"
    played = []
    monkeypatch.setattr(train_cli, "load_run_policy", lambda c: (None, read_run_config(run / "config.json")))
    monkeypatch.setattr(train_cli, "evaluate", lambda policy, cfg, **kw: played.append(cfg.env) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        train_cli.eval_main(["--checkpoint", str(run)])
    assert played == ["CreditToy-v0"] and not planted.exists()
