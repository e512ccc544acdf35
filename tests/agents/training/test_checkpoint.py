"""Load errors of checkpoints name the file and what torch found in it, never torch's advice to load
the file with ``weights_only=False`` (which would run the code a crafted file holds)."""

import datetime
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from twice_envs.agents.models.export import checkpoint_recipe  # noqa: E402
from twice_envs.agents.models.recipes import TinyModelConfig  # noqa: E402
from twice_envs.agents.models.resume import CHECKPOINT_DIR, STATE_FILE, read_state  # noqa: E402
from twice_envs.agents.training.checkpoint import CheckpointError, load_failure, read_checkpoint  # noqa: E402


class _Shell:
    """Unpickling this runs a shell command that creates ``marker`` (os.system: a module torch blocks)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _zip(value):
    return lambda file: torch.save({"format": 1, "model": value}, file)


def _raw(value):
    return lambda file: file.write_bytes(pickle.dumps({"model": value}))


#: (how the file is written, what torch found, named in the error)
CRAFTED = [
    (lambda m: _zip(_Shell(m)), "posix.system"),
    (lambda m: _raw(_Shell(m)), "Unsupported operand"),
    (lambda m: _zip(datetime.date(2020, 1, 1)), "datetime.date"),
    (lambda m: _zip(np.arange(3)), "numpy"),
]


@pytest.mark.parametrize("write,finding", CRAFTED, ids=["blocked-module", "raw-pickle", "global", "numpy"])
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_refused_file_is_named_with_the_finding_and_no_advice_to_load_it_unsafely(tmp_path, write, finding):
    marker = tmp_path / "ran"
    build = tmp_path / "build"
    file = build / CHECKPOINT_DIR / STATE_FILE
    file.parent.mkdir(parents=True)
    write(marker)(file)
    readers = [read_checkpoint, lambda f: read_state(f, "reader", TinyModelConfig()),
               lambda f: checkpoint_recipe(build)]
    for read in readers:
        with pytest.raises(CheckpointError) as err:
            read(file)
        message = str(err.value)
        assert message.startswith(f"{file}: ") and finding in message
        for advice in ("weights_only", "trusted source", "file an issue", "safe_globals", "\x1b"):
            assert advice not in message, message
    assert not marker.exists()


def test_load_failure_keeps_the_kind_and_the_finding_of_other_errors():
    assert load_failure(EOFError()) == "EOFError"
    assert load_failure(RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central "
                                     "directory")).startswith("RuntimeError: PytorchStreamReader failed")
