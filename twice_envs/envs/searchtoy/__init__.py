"""SearchToy: a multi-hop search MDP small enough for exact values (see :mod:`.env`)."""
