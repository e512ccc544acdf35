"""missing_main_guard: the explanation added when a spawned worker dies at start, only where it applies."""

import sys
import types

import pytest

from twice_envs._main_guard import _guarded, missing_main_guard


@pytest.mark.parametrize("source,guarded", [
    ('if __name__ == "__main__":\n    main()\n', True),
    ("if '__main__' == __name__:\n    main()\n", True),
    ('import x\nif __name__ == "__main__":\n    pass\nelse:\n    pass\n', True),
    ("main()\n", False),
    ('def f():\n    if __name__ == "__main__":\n        main()\n', False),  # not at the top level
    ('if __name__ != "__main__":\n    main()\n', False),
    ('if __name__ == "__mp_main__":\n    main()\n', False),
])
def test_the_guard_is_found_at_the_top_level_only(source, guarded):
    assert _guarded(source) is guarded


def test_the_explanation_applies_to_a_reimporting_start_method_and_an_unguarded_script(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text("main()\n")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    for method in ("spawn", "forkserver"):
        assert f"{script} has no `if __name__ == \"__main__\":` guard" in missing_main_guard(method)
    assert missing_main_guard("fork") is None
    script.write_text('if __name__ == "__main__":\n    main()\n')
    assert missing_main_guard("spawn") is None
    script.write_text("if (:\n")  # unparsable: said as a possibility
    assert missing_main_guard("spawn").startswith(f"a worker died at start; if {script} has no")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace())  # python -c, a notebook
    assert missing_main_guard("spawn") is None
