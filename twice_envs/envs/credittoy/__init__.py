"""CreditToy: three choices of four actions, small enough for exact values (see :mod:`.env`)."""
