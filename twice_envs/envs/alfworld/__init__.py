"""ALFWorld-v0: the real ALFWorld text engine as a deterministic, forkable env.

Importing this package is light: the engine (``alfworld``, ``textworld[pddl]``,
``fast-downward-textworld``; ``pip install 'twice-envs[alfworld]'``) is imported when
an env is made.
"""
