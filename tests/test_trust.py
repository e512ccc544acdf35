"""The trust rule's two functions, which every reader of files applies: ids from the registry only, and
file or folder kwargs only with consent."""

import sys

import pytest

from twice_envs.trust import UntrustedInput, check_path_consent, path_kwargs, registered_id

CONSENT = "Consent with --yes."


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on the path that leaves a file behind if anything imports it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_trust_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("planted_trust_mod", None)


def test_registered_ids_resolve_without_importing(planted):
    assert registered_id("SearchQA-v0", "f.json") == "SearchQA-v0"
    assert registered_id("twice_envs/SearchQA-v0", "f.json") == "SearchQA-v0"
    assert registered_id("planted_trust_mod:SearchQA-v0", "f.json") == "SearchQA-v0"  # the module is ignored
    for bad, says in [
        ("planted_trust_mod:X-v0", "f.json: env id 'planted_trust_mod:X-v0' names a module to import "
                                   "('planted_trust_mod'), and 'X-v0' is not registered"),
        ("twice_envs/planted_trust_mod:X-v0", "names a module to import ('planted_trust_mod')"),
        ("Nope-v0", "f.json: env id 'Nope-v0' is not registered here"),
        (7, "f.json: the env id must be a string, found int 7"),
        ("x" * 10_000, "is not registered here"),
    ]:
        with pytest.raises(UntrustedInput) as err:
            registered_id(bad, "f.json")
        assert says in str(err.value) and len(str(err.value)) < 600
    assert not planted.exists() and "planted_trust_mod" not in sys.modules


def test_path_kwargs_of_an_id_not_registered_are_found_by_name():
    assert path_kwargs("Nope-v0", {"journal": "j", "data_dir": "d", "topk": 3}) == ["data_dir", "journal"]


def test_consent_names_the_kwargs_and_the_source_and_passes_the_users_own_and_consented_ones():
    kwargs = {"journal": "/x/j.db", "corpus": "c.jsonl", "topk": 3, "cache_root": None}
    with pytest.raises(UntrustedInput) as err:
        check_path_consent("SearchQA-v0", kwargs, source="run/config.json", trusted=False, consent=CONSENT)
    assert str(err.value) == (
        "run/config.json names files or folders in its kwargs for SearchQA-v0 (corpus='c.jsonl', journal='/x/j.db'); "
        "the env would read and write where run/config.json says. Consent with --yes.")
    with pytest.raises(UntrustedInput, match=r"\(journal='/x/j.db'\).*named: journal$"):
        check_path_consent("SearchQA-v0", kwargs, source="s", trusted=False, exempt={"corpus"},
                           consent=lambda named: f"named: {', '.join(named)}")
    check_path_consent("SearchQA-v0", kwargs, source="s", trusted=False, exempt={"corpus", "journal"}, consent="")
    check_path_consent("SearchQA-v0", kwargs, source="s", trusted=True, consent="")
    with pytest.raises(UntrustedInput, match="s: the env kwargs must be a JSON object, found list"):
        check_path_consent("SearchQA-v0", ["journal"], source="s", trusted=True, consent="")
