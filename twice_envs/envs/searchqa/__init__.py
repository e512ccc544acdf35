"""SearchQA: the Search-R1 protocol as a replayable, forkable env (see :mod:`.env`)."""
