"""Imported by the forkserver that :func:`twice_envs.workers.preload_forkserver` sets up:
makes the envs named in ``$TWICE_FORKSERVER_PRELOAD`` once and freezes the heap.

Importing it never raises, whatever the variable holds (:func:`~twice_envs.workers.load_in_server`
reports each fault on stderr): an exception here would stop the server, and every
forkserver worker after it."""

from twice_envs.workers import load_in_server

PRELOADED = load_in_server()
