"""ChoiceLab: many tasks of long runs of choices among items, with exact values (see :mod:`.env`)."""
