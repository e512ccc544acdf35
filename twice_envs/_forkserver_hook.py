"""Imported by the forkserver that :func:`twice_envs.workers.preload_forkserver` sets up:
makes the envs named in ``$TWICE_FORKSERVER_PRELOAD`` once and freezes the heap."""

from twice_envs.workers import load_in_server

PRELOADED = load_in_server()
