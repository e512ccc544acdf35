"""The documented noun rule used by the reward's title score."""

from twice_envs.envs.webshop.nouns import nouns


def test_nouns_rule():
    assert nouns("The Ergonomic Office Chair with Lumbar Support, Black") == ("ergonomic", "office", "chair", "lumbar", "support", "black")
    assert nouns("2 Pack Stainless Steel Water Bottles - Insulated, Leakproof 32 oz") == ("pack", "steel", "water", "bottles", "leakproof", "oz")
    assert nouns("Speed Table for the Bed") == ("speed", "table", "bed")  # listed exceptions to the suffix rules
    assert nouns("Men's D.O.N. Runner") == ("men's", "d.o.n", "runner")
    assert nouns("New Soft Lightweight") == ()
    assert nouns("Bar Bar Stool") == ("bar", "bar", "stool")  # repeats kept: they count in the denominator
