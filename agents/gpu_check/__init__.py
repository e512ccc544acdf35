"""``twice check-gpu``: checks of the keyed sampler and a model build on a CUDA GPU.

Sections, run in this order; each has its own time budget, and one that fails, raises or runs
out of time does not stop the others:

* ``setup`` (:mod:`.context`): the machine, the library versions and the model the checks use.
* ``a`` (:mod:`.philox`): Philox on the GPU is bit-identical to the numpy reference.
* ``b`` (:mod:`.tokens`): the transformers keyed sampler emits the same tokens on the GPU as on
  the CPU for SmolLM2-135M, in all four key modes and greedy, in fp32 (judged) and bf16 (measured).
* ``c`` (:mod:`.timing`): the keyed sampler's share of generation time at batch 8 and 64.
* ``d`` (:mod:`.build`): the step rate of a 50-step ``alfworld-smol`` build on the GPU.

The report (``gpu_check.json`` and ``gpu_check.txt``, :mod:`.report`) is written after every
section. ``--cpu`` runs every section at tiny sizes on the CPU. ``--bundle DIR``
(:mod:`.bundle`) writes the wheels an offline machine needs to run the check.
"""
